"""The SGLang plugin's pool and attention backend driven with real SGLang objects
(``ForwardBatch``, ``RadixAttention``, ``ReqToTokenPool``; needs ``sglang``, skipped without
it: ``pip install -e .[sglang,test]``).

* Extend (chunked prefill) and decode equal the public ops bit for bit.
* CUDA-graph planning (persistent buffers, padded batches on the planned spare window slots)
  equals eager planning.
* A request reusing a cached 1,000-token prefix in a stale request row gets its window
  rebuilt and equals an independent request.
* Without the sink store, outputs are unchanged and a prefix hit is recomputed.
* Unsupported layers are rejected.

The pool is built with the hooks' process state (``hooks.STATE``), so SGLang's own
``ReqToTokenPool.alloc_rows``, patched by the plugin, marks the rows the backend rebuilds.
"""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("sglang")

from helpers import i32, random_rotation  # noqa: E402
from oscar_kernels import ops  # noqa: E402
from oscar_kernels.errors import UnsupportedConfigError  # noqa: E402
from oscar_kernels.integrations.sglang.config import OscarConfig  # noqa: E402
from oscar_kernels.integrations.sglang.hooks import STATE  # noqa: E402
from oscar_kernels.integrations.sglang.memory_plan import int2_sink_store_bytes  # noqa: E402
from oscar_kernels.integrations.sglang.pages import page_table_from_req_to_token  # noqa: E402
from oscar_kernels.integrations.sglang.prefix import reusable_prefix_len, sink_key  # noqa: E402

H, HQ, D = 2, 8, 64


class _Harness:
    """The scheduler's part: request rows, token slots, ForwardBatch objects."""

    def __init__(self, gen, *, sink=16, recent=64, num_layers=2, sink_entries=32, spares=3):
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from oscar_kernels.integrations.sglang.backend import OscarInt2AttnBackend
        from oscar_kernels.integrations.sglang.pool import OscarInt2TokenToKVPool

        cfg = OscarConfig(sink_size=sink, recent_size=recent, backend="reference",
                          sink_entries=sink_entries)
        self.rots = [random_rotation(H, D, gen) for _ in range(num_layers)]
        self.rtp = ReqToTokenPool(8, 2048, "cpu", False)
        # window slots as planned: 8 request rows, the padding row 0, graph spares
        self.pool = OscarInt2TokenToKVPool(4096, 1, torch.bfloat16, H, D, num_layers, "cpu",
                                           False, rotations=self.rots, config=cfg, state=STATE,
                                           num_window_slots=9 + spares)
        self.pool.num_qo_heads = HQ
        runner = types.SimpleNamespace(token_to_kv_pool=self.pool, req_to_token_pool=self.rtp,
                                       device="cpu")
        self.backend = OscarInt2AttnBackend(runner)
        self.layers = [RadixAttention(HQ, D, D ** -0.5, H, i) for i in range(num_layers)]
        self.next_slot = 1

    def new_row(self):
        return self.rtp.alloc_rows(1)[0]

    def slots(self, n):
        s = torch.arange(self.next_slot, self.next_slot + n, dtype=torch.int32)
        self.next_slot += n
        return s

    def batch(self, mode, rows, seq_lens, prefix_lens=None, ext_lens=None):
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        fb = ForwardBatch(forward_mode=getattr(ForwardMode, mode), batch_size=len(rows),
                          input_ids=torch.zeros(sum(ext_lens or [1] * len(rows)),
                                                dtype=torch.int64),
                          req_pool_indices=torch.tensor(rows, dtype=torch.int64),
                          seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
                          out_cache_loc=torch.zeros(1, dtype=torch.int64),
                          seq_lens_sum=sum(seq_lens))
        fb.seq_lens_cpu = fb.seq_lens.clone()
        fb.req_pool_indices_cpu = fb.req_pool_indices.clone()
        if mode == "EXTEND":
            fb.extend_prefix_lens_cpu = list(prefix_lens)
            fb.extend_seq_lens_cpu = list(ext_lens)
        return fb

    def forward(self, fb, qkv):
        self.backend.init_forward_metadata(fb)
        outs = []
        for layer, (q, k, v) in zip(self.layers, qkv):
            o = self.backend.forward(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1),
                                     v.reshape(v.shape[0], -1), layer, fb)
            outs.append(o.reshape(-1, HQ, D))
        return outs


def _qkv(gen, n, layers=2):
    return [(torch.randn(n, HQ, D, generator=gen).to(torch.bfloat16),
             torch.randn(n, H, D, generator=gen).to(torch.bfloat16),
             torch.randn(n, H, D, generator=gen).to(torch.bfloat16)) for _ in range(layers)]


def test_backend_extend_decode_equal_ops(hooks_applied, gen):
    hz = _Harness(gen)
    rows = [hz.new_row(), hz.new_row()]
    lens = [150, 97]
    for r, n in zip(rows, lens):
        hz.rtp.req_to_token[r, :n + 3] = hz.slots(n + 3)
    # chunked prefill: two chunks, then three decode steps
    chunks = [[100, 60], [50, 37]]
    done = [0, 0]
    qkv_all = [_qkv(gen, sum(c)) for c in chunks]
    for c, qkv in zip(chunks, qkv_all):
        now = [d + x for d, x in zip(done, c)]
        hz.forward(hz.batch("EXTEND", rows, now, done, c), qkv)
        done = now
    dec = [_qkv(gen, 2) for _ in range(3)]
    got = [hz.forward(hz.batch("DECODE", rows, [n + s + 1 for n in lens]), q) for s, q in
           enumerate(dec)]
    # the same through the public ops on a fresh cache: one extend over the whole prompt
    from helpers import poisoned_cache

    for li in range(2):
        cache = poisoned_cache(hz.pool.spec, hz.pool.num_pages, hz.pool.num_window_slots)
        parts = [[], [], []]  # q, k, v of the whole prompt, sequence by sequence
        for b in range(2):
            for qkv, c in zip(qkv_all, chunks):
                off = 0 if b == 0 else c[0]
                for t in range(3):
                    parts[t].append(qkv[li][t][off:off + c[b]])
        q, k, v = (torch.cat(p) for p in parts)
        ip, ix, last = page_table_from_req_to_token(hz.rtp.req_to_token, i32(rows), i32(lens), 1)
        ops.paged_extend_attention(q, k, v, i32([0, lens[0], sum(lens)]), cache, ip, ix, last,
                                   i32(rows), hz.rots[li], backend="reference")
        for s, qkvd in enumerate(dec):
            n = [x + s + 1 for x in lens]
            ip, ix, last = page_table_from_req_to_token(hz.rtp.req_to_token, i32(rows), i32(n), 1)
            qd, kd, vd = qkvd[li]
            ops.quantize_append_paged_kv_cache(kd, vd, i32([0, 1]), i32([x - 1 for x in n]),
                                               cache, ix, ip, last, i32(rows), hz.rots[li],
                                               backend="reference")
            want = ops.paged_decode_attention(qd, cache, ip, ix, last, i32(rows), hz.rots[li],
                                              backend="reference")
            assert torch.equal(got[s][li], want), (li, s)
        assert torch.equal(cache.k_codes[1:sum(lens) + 7],
                           hz.pool.layer_cache(li).k_codes[1:sum(lens) + 7])


def test_backend_graph_mode_planning_equals_eager(hooks_applied, gen):
    """The CUDA-graph hooks on the CPU (no graph is captured here): decode planned by
    init_forward_metadata_out_graph into the persistent buffers of init_cuda_graph_state
    (padded batch: a repeated padding row gets a spare window slot) gives the eager
    results, and the run reads the persistent buffers. The spares are the pool's planned
    ones: the graph state allocates no window memory, and a batch beyond them is a typed
    error naming the flag."""
    outs = []
    for graph in (False, True):
        g = torch.Generator().manual_seed(5)
        hz = _Harness(g)
        rows = [hz.new_row(), hz.new_row()]
        for r in rows:
            hz.rtp.req_to_token[r, :81] = hz.slots(81)
        hz.forward(hz.batch("EXTEND", rows, [80, 80], [0, 0], [80, 80]), _qkv(g, 160))
        dec = _qkv(g, 4)
        if graph:
            windows = [(c.k_window.data_ptr(), c.v_window.data_ptr()) for c in hz.pool.layers]
            hz.backend.init_cuda_graph_state(4, 4)
            # the pool's 3 planned spares serve batch 4; nothing is allocated
            assert [(c.k_window.data_ptr(), c.v_window.data_ptr())
                    for c in hz.pool.layers] == windows
            with pytest.raises(UnsupportedConfigError, match=r"batch 5 need 4 spare window "
                                                             r"slots.*reserved 3.*"
                                                             r"--cuda-graph-max-bs-decode"):
                hz.backend.init_cuda_graph_state(5, 5)
            with pytest.raises(UnsupportedConfigError, match="repeats request rows 4 times"):
                hz.backend._window_slots(torch.zeros(5, dtype=torch.int64))
            # bs padded to 4 with SGLang's padding row 0 (twice: the repeat gets a spare slot)
            fb = hz.batch("DECODE", rows + [0, 0], [81, 81, 1, 1])
            hz.backend.init_forward_metadata_out_graph(fb, in_capture=True)
            hz.backend.init_forward_metadata_in_graph(fb)
            meta = hz.backend.forward_metadata
            assert meta["positions"].data_ptr() == hz.backend.graph_buffers["positions"].data_ptr()
            plan = meta["wrapper"]._plan
            assert plan["indptr"].data_ptr() == hz.backend.graph_buffers["indptr"].data_ptr()
            assert sorted(plan["window_slots"].tolist())[-1] >= hz.backend.num_rows
            got = []
            for layer, (q, k, v) in zip(hz.layers, dec):
                got.append(hz.backend.forward(q.reshape(4, -1), k.reshape(4, -1),
                                              v.reshape(4, -1), layer, fb).reshape(-1, HQ, D))
            outs.append([o[:2] for o in got])
        else:
            outs.append(hz.forward(hz.batch("DECODE", rows, [81, 81]),
                                   [tuple(t[:2] for t in x) for x in dec]))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_backend_prefix_hit_equals_independent_requests(hooks_applied, gen):
    """Two requests sharing a cached 1,000-token prefix give the same attention outputs as
    independent requests. Request A writes the prefix; B arrives with the same first tokens
    in a request row an unrelated request used before (stale window slot). The plugin's
    prefix-match hook cuts B's hit to P' (reusable_prefix_len) so SGLang recomputes
    [P', P) from real K/V; the sink store gives B A's BF16 sinks."""
    hz = _Harness(gen, sink=64, recent=256, num_layers=2)
    P, S = 1000, 24
    tokens = torch.randint(0, 1000, (P + S,), generator=gen).tolist()
    key = sink_key(tokens, 64)
    prefix_qkv = _qkv(gen, P)
    sfx_qkv = _qkv(gen, S)
    a = hz.new_row()
    STATE.set_row_sink_key(a, key)
    hz.rtp.req_to_token[a, :P] = hz.slots(P)
    hz.forward(hz.batch("EXTEND", [a], [P], [0], [P]), prefix_qkv)  # A's prefill
    assert STATE.has_sink_entry(key)
    keep = reusable_prefix_len(P, sink_size=64, recent_size=256, page_size=1,
                               have_sinks=STATE.has_sink_entry(key))
    assert keep == P - 256
    outs = {}
    for name, stale in (("B", True), ("C", False)):
        if stale:  # an unrelated request occupies a row, then frees it
            junk = hz.new_row()
            STATE.set_row_sink_key(junk, sink_key(list(range(64)), 64))
            hz.rtp.req_to_token[junk, :300] = hz.slots(300)
            hz.forward(hz.batch("EXTEND", [junk], [300], [0], [300]), _qkv(gen, 300))
            hz.rtp.free_slots.append(junk)
        row = hz.new_row()
        assert not stale or row == junk
        STATE.set_row_sink_key(row, key)
        hz.rtp.req_to_token[row, :keep] = hz.rtp.req_to_token[a, :keep]  # the (cut) hit
        hz.rtp.req_to_token[row, keep:P + S] = hz.slots(P + S - keep)
        qkv = [tuple(torch.cat([pq[t][keep:], sq[t]]) for t in range(3))
               for pq, sq in zip(prefix_qkv, sfx_qkv)]
        o = hz.forward(hz.batch("EXTEND", [row], [P + S], [keep], [P + S - keep]), qkv)
        outs[name] = [x[P - keep:] for x in o]
        hz.rtp.free_slots.append(row)
    # fully independent request: prefix and suffix written by itself
    ind = hz.new_row()
    STATE.set_row_sink_key(ind, key)
    hz.rtp.req_to_token[ind, :P + S] = hz.slots(P + S)
    qkv = [tuple(torch.cat([pq[t], sq[t]]) for t in range(3)) for pq, sq in zip(prefix_qkv,
                                                                              sfx_qkv)]
    full = [x[P:] for x in hz.forward(hz.batch("EXTEND", [ind], [P + S], [0], [P + S]), qkv)]
    for li in range(2):
        assert torch.equal(outs["B"][li], full[li]), li
        assert torch.equal(outs["C"][li], full[li]), li


def test_backend_without_sink_store(hooks_applied):
    """--oscar-sink-cache-entries 0: the pool holds no sink store, a prefill that completes
    the sinks stores nothing, outputs equal those with a store, and a prefix hit is cut to 0
    (the request recomputes its prompt)."""
    outs = {}
    for entries in (32, 0):
        g = torch.Generator().manual_seed(11)
        hz = _Harness(g, sink_entries=entries)
        assert sum(k.nbytes + v.nbytes for k, v in hz.pool.sink_store) == \
            int2_sink_store_bytes(num_kv_heads=H, head_dim=D, num_layers=2,
                                  config=hz.pool.config)
        row = hz.new_row()
        key = sink_key(list(range(200)), 16)
        STATE.set_row_sink_key(row, key)
        hz.rtp.req_to_token[row, :120] = hz.slots(120)
        outs[entries] = hz.forward(hz.batch("EXTEND", [row], [120], [0], [120]), _qkv(g, 120))
        assert STATE.has_sink_entry(key) == (entries > 0)
        assert len(hz.pool.sink_index) == (1 if entries else 0)
    assert hz.pool.sink_store[0][0].shape[0] == 0
    for a, b in zip(outs[32], outs[0]):
        assert torch.equal(a, b)
    keep = reusable_prefix_len(120, sink_size=16, recent_size=64, page_size=1,
                               have_sinks=STATE.has_sink_entry(key))
    assert keep == 0


def test_backend_rejects_unsupported_layers(hooks_applied, gen):
    from sglang.srt.layers.radix_attention import RadixAttention

    hz = _Harness(gen, num_layers=1)
    row = hz.new_row()
    hz.rtp.req_to_token[row, :10] = hz.slots(10)
    fb = hz.batch("EXTEND", [row], [10], [0], [10])
    hz.backend.init_forward_metadata(fb)
    q, k, v = _qkv(gen, 10, 1)[0]
    for layer, msg in ((RadixAttention(HQ, D, 0.1, H, 0, logit_cap=30.0), "soft-capping"),
                       (RadixAttention(HQ, D, 0.1, H, 0, sliding_window_size=128),
                        "sliding-window")):
        with pytest.raises(UnsupportedConfigError, match=msg):
            hz.backend.forward(q.reshape(10, -1), k.reshape(10, -1), v.reshape(10, -1), layer, fb)
