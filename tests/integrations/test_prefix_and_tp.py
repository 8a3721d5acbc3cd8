"""Prefix caching and tensor parallelism at the op level (CPU, reference backend).

* Two requests sharing a 1,000-token prefix, the second reusing the first's INT2 pages and
  getting its own window slot rebuilt from real K/V (docs/format.md section 5), give the same
  attention outputs as two independent requests.
* KV heads split across 2 simulated ranks, each with its own cache and its slice of the
  per-head rotations: per-rank outputs concatenate to the single-rank output.
* The SGLang plugin's pure-torch helpers: page table from req_to_token rows, window rebuild
  from pages, artifact loading for a directory / RotationZoo pair, unsupported-config errors.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from helpers import i32, poisoned_cache, random_rotation
from oscar_kernels import (ArtifactError, CacheSpec, ModelFingerprint, RotationArtifact,
                           UnsupportedConfigError, ops)
from oscar_kernels.integrations import flashinfer as fi
from oscar_kernels.integrations import sglang as plugin
from oscar_kernels.integrations.tp import kv_head_range, qo_head_range, shard_rotation
from oscar_kernels.reference.paged import gather_int2, rotate

PREFIX, SUFFIX = 1000, 37
HEADS, GQA, D, PAGE = 2, 4, 64, 16


def _table(page_ids, length):
    n = -(-length // PAGE)
    return i32([0, n]), i32(page_ids[:n]), i32([(length - 1) % PAGE + 1])


def _extend(cache, q, k, v, page_ids, start, length, slot, rot):
    """Append tokens [start, length) of one sequence and attend with their queries."""
    ip, ix, last = _table(page_ids, length)
    return ops.paged_extend_attention(q, k, v, i32([0, length - start]), cache, ip, ix, last,
                                      i32([slot]), rot, backend="reference")


def test_shared_prefix_equals_independent_requests(gen):
    spec = CacheSpec(num_kv_heads=HEADS, head_dim=D, page_size=PAGE, sink_size=64,
                     recent_size=256)
    rot = random_rotation(HEADS, D, gen)
    total = PREFIX + SUFFIX
    k_pre = torch.randn(PREFIX, HEADS, D, generator=gen).to(torch.bfloat16)
    v_pre = torch.randn(PREFIX, HEADS, D, generator=gen).to(torch.bfloat16)
    q_pre = torch.randn(PREFIX, HEADS * GQA, D, generator=gen).to(torch.bfloat16)
    sfx = [tuple(torch.randn(SUFFIX, h, D, generator=gen).to(torch.bfloat16)
                 for h in (HEADS * GQA, HEADS, HEADS)) for _ in range(2)]
    pages_pre = -(-PREFIX // PAGE)  # 63 pages, the last one partial (1000 = 62 * 16 + 8)
    pages_all = -(-total // PAGE)

    # independent: each request has its own pages and its own slot
    indep = poisoned_cache(spec, 2 * pages_all + 2, 4)
    want = []
    for r in range(2):
        ids = list(range(r * pages_all, (r + 1) * pages_all))
        _extend(indep, q_pre, k_pre, v_pre, ids, 0, PREFIX, 2 * r, rot)
        q_s, k_s, v_s = sfx[r]
        want.append(_extend(indep, q_s, k_s, v_s, ids, PREFIX, total, 2 * r, rot))

    # shared: request 0 writes the prefix; request 1 reuses its full pages (the partial last
    # page is copied-on-write, as a radix cache with page_size > 1 would: whole pages only)
    shared = poisoned_cache(spec, 2 * pages_all + 2, 4)
    ids0 = list(range(pages_all))
    _extend(shared, q_pre, k_pre, v_pre, ids0, 0, PREFIX, 0, rot)
    reuse = (PREFIX // PAGE) * PAGE  # 992 tokens in full pages
    ids1 = ids0[: reuse // PAGE] + list(range(pages_all, pages_all + pages_all - reuse // PAGE))
    # slot 3 last held an unrelated request: poison it with finite garbage (stale rows)
    shared.k_window[3] = torch.randn(shared.k_window.shape[1:], generator=gen).to(torch.bfloat16)
    shared.v_window[3] = torch.randn(shared.v_window.shape[1:], generator=gen).to(torch.bfloat16)
    pages_before = {n: t.clone() for n, t in shared.tensors().items() if "window" not in n}
    # rebuild request 1's window from real K/V: sink rows + recent rows of the reused part
    ip, ix, last = _table(ids1, reuse)
    keep = [p for p in range(reuse) if p < spec.sink_size or p >= reuse - spec.recent_size]
    b, p = fi.get_batch_indices_positions(i32([0, len(keep)]), i32([reuse]), len(keep))
    p = i32(keep)
    kk, vv = k_pre[keep], v_pre[keep]
    ops.quantize_append_paged_kv_cache(kk, vv, b, p, shared, ix, ip, last, i32([3]), rot,
                                       backend="reference")
    for n, t in pages_before.items():  # shared pages unchanged, byte for byte
        assert torch.equal(t.view(torch.uint8), shared.tensors()[n].view(torch.uint8)), n
    # request 1: the rest of the prefix (copy-on-write page) and its suffix in one extend
    q1, k1, v1 = sfx[1]
    tail = slice(reuse, PREFIX)
    got1 = _extend(shared, torch.cat([q_pre[tail], q1]), torch.cat([k_pre[tail], k1]),
                   torch.cat([v_pre[tail], v1]), ids1, reuse, total, 3, rot)[PREFIX - reuse:]
    # request 0 continues with its own suffix on the original pages
    q0, k0, v0 = sfx[0]
    got0 = _extend(shared, q0, k0, v0, ids0, PREFIX, total, 0, rot)
    assert torch.equal(got0, want[0])
    assert torch.equal(got1, want[1])
    # the two requests' pages of the shared prefix hold identical bytes
    for name in ("k_codes", "k_params", "v_codes", "v_params"):
        t = getattr(shared, name)
        assert torch.equal(t[: reuse // PAGE].view(torch.uint8),
                           getattr(indep, name)[pages_all: pages_all + reuse // PAGE]
                           .view(torch.uint8))


def test_stale_window_is_not_served_and_pages_rebuild_is_deterministic(gen):
    """Without the rebuild a reused slot serves stale rows (the failure the plugin
    prevents); the plugin's rebuild-from-pages gives every request reusing the prefix the
    same output, whatever its slot held before."""
    spec = CacheSpec(num_kv_heads=HEADS, head_dim=D, page_size=PAGE, sink_size=8,
                     recent_size=24)
    rot = random_rotation(HEADS, D, gen)
    n = 100
    k = torch.randn(n, HEADS, D, generator=gen).to(torch.bfloat16)
    v = torch.randn(n, HEADS, D, generator=gen).to(torch.bfloat16)
    q = torch.randn(n, HEADS * GQA, D, generator=gen).to(torch.bfloat16)
    cache = poisoned_cache(spec, 16, 4)
    ids = list(range(8))
    _extend(cache, q, k, v, ids, 0, n, 0, rot)
    qn = torch.randn(1, HEADS * GQA, D, generator=gen).to(torch.bfloat16)
    ip, ix, last = _table(ids, n)
    outs = []
    for slot in (1, 2):
        cache.k_window[slot] = torch.randn(cache.k_window.shape[1:], generator=gen).to(
            torch.bfloat16)
        cache.v_window[slot] = torch.randn(cache.v_window.shape[1:], generator=gen).to(
            torch.bfloat16)
        stale = ops.paged_decode_attention(qn, cache, ip, ix, last, i32([slot]), rot,
                                           backend="reference")
        plugin.rebuild_window_from_pages(cache, ix, slot, n)
        outs.append(ops.paged_decode_attention(qn, cache, ip, ix, last, i32([slot]), rot,
                                               backend="reference"))
        assert not torch.allclose(stale, outs[-1], atol=1e-2)
    assert torch.equal(outs[0], outs[1])
    # the rebuilt rows are the INT2 rows of the shared pages, in BF16
    k_int2, _ = gather_int2(cache, ix, n)
    assert torch.equal(cache.k_window[1, :8], k_int2[:8].to(torch.bfloat16))
    assert torch.equal(cache.k_window[1, 8 + (n - 1) % 24], k_int2[n - 1].to(torch.bfloat16))
    # and they stay within INT2 error of the exact rows
    exact = rotate(k[n - 1:n], rot.rot_k)[0]
    assert float((k_int2[n - 1] - exact).abs().max()) < float(exact.abs().max())


@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("tp_size,num_kv_heads", [(2, 4), (2, 2), (4, 2)])
def test_tp_ranks_concatenate_to_single_rank(tp_size, num_kv_heads, per_head, gen):
    gqa, d = 3, 64
    hq = num_kv_heads * gqa
    spec = CacheSpec(num_kv_heads=num_kv_heads, head_dim=d, page_size=16, sink_size=8,
                     recent_size=32)
    rot = random_rotation(num_kv_heads, d, gen, per_head=per_head)
    lens = [70, 133]
    nnz = sum(lens)
    k = torch.randn(nnz, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(nnz, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    q_ext = torch.randn(nnz, hq, d, generator=gen).to(torch.bfloat16)
    k_dec = torch.randn(2, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    v_dec = torch.randn(2, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    q_dec = torch.randn(2, hq, d, generator=gen).to(torch.bfloat16)
    pages = [-(-(n + 1) // 16) for n in lens]
    ix = i32(list(range(sum(pages))))
    ip = i32([0, pages[0], sum(pages)])

    def run(heads, r, qh):
        s = dataclasses.replace(spec, num_kv_heads=heads[1] - heads[0])
        cache = poisoned_cache(s, sum(pages) + 1, 2)
        kk, vv = k[:, heads[0]:heads[1]], v[:, heads[0]:heads[1]]
        ip_e = i32([0, -(-lens[0] // 16), -(-lens[0] // 16) + -(-lens[1] // 16)])
        ix_e = torch.cat([ix[:-(-lens[0] // 16)], ix[pages[0]: pages[0] + -(-lens[1] // 16)]])
        last_e = i32([(n - 1) % 16 + 1 for n in lens])
        o_ext = ops.paged_extend_attention(q_ext[:, qh[0]:qh[1]], kk, vv, i32([0, lens[0], nnz]),
                                           cache, ip_e, ix_e, last_e, i32([0, 1]), r,
                                           backend="reference")
        last = i32([n % 16 + 1 for n in lens])
        ops.quantize_append_paged_kv_cache(k_dec[:, heads[0]:heads[1]], v_dec[:, heads[0]:heads[1]],
                                           i32([0, 1]), i32(lens), cache, ix, ip, last,
                                           i32([0, 1]), r, backend="reference")
        o_dec = ops.paged_decode_attention(q_dec[:, qh[0]:qh[1]], cache, ip, ix, last,
                                           i32([0, 1]), r, backend="reference")
        return o_ext, o_dec, cache

    full_ext, full_dec, full_cache = run((0, num_kv_heads), rot, (0, hq))
    parts = []
    for rank in range(tp_size):
        h0, h1 = kv_head_range(rank, tp_size, num_kv_heads)
        q0, q1 = qo_head_range(rank, tp_size, hq) if tp_size <= num_kv_heads else \
            (h0 * gqa, h1 * gqa)
        r_rank = shard_rotation(rot, h0, h1, num_kv_heads)
        assert r_rank.rot_k.shape[0] == (h1 - h0 if per_head else 1)
        o_ext, o_dec, cache = run((h0, h1), r_rank, (q0, q1))
        parts.append((q0, q1, o_ext, o_dec))
        # each rank's pages hold exactly the single-rank bytes of its heads
        assert torch.equal(cache.k_codes, full_cache.k_codes[:, :, h0:h1])
    if tp_size > num_kv_heads:  # replicated KV heads: ranks sharing a head agree
        for a, b in zip(parts, parts[1:]):
            if a[:2] == b[:2]:
                assert torch.equal(a[3], b[3])
        parts = list({p[0]: p for p in parts}.values())
    got_ext = torch.cat([p[2] for p in parts], dim=1)
    got_dec = torch.cat([p[3] for p in parts], dim=1)
    assert torch.equal(got_ext, full_ext)
    assert torch.equal(got_dec, full_dec)


def test_tp_helpers_errors():
    assert kv_head_range(3, 4, 8) == (6, 8)
    assert [kv_head_range(r, 8, 2) for r in range(8)] == [(0, 1)] * 4 + [(1, 2)] * 4
    with pytest.raises(ValueError, match="tp_size"):
        kv_head_range(0, 3, 8)
    with pytest.raises(ValueError, match="tp_rank"):
        kv_head_range(4, 4, 8)


# ------------------------------------------------------------ plugin helpers (no sglang)
def test_page_table_from_req_to_token(gen):
    for page_size in (1, 4):
        req_to_token = torch.zeros(6, 64, dtype=torch.int32)
        free = torch.randperm(60, generator=gen) + 1  # page ids, 0 is SGLang's padding page
        lens = [13, 1, 30]
        rows = [4, 0, 2]
        k = 0
        for r, n in zip(rows, lens):
            npg = -(-n // page_size)
            pg = free[k:k + npg]
            k += npg
            slots = (pg[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:n]
            req_to_token[r, :n] = slots.to(torch.int32)
        ip, ix, last = plugin.page_table_from_req_to_token(req_to_token, i32(rows), i32(lens),
                                                            page_size)
        want_pages = [-(-n // page_size) for n in lens]
        assert ip.tolist() == [0, want_pages[0], sum(want_pages[:2]), sum(want_pages)]
        assert ix.tolist() == free[:sum(want_pages)].tolist()
        assert last.tolist() == [(n - 1) % page_size + 1 for n in lens]
        assert torch.equal(fi.get_seq_lens(ip, last, page_size), i32(lens))


def test_plugin_config_and_artifact_loading(tmp_path, gen):
    env = {}
    plugin.OscarConfig(rotation_path=None, sink_size=32, recent_size=128).to_env(env)
    assert plugin.int2_enabled(env)
    cfg = plugin.OscarConfig.from_env(env)
    assert (cfg.sink_size, cfg.recent_size, cfg.group_size) == (32, 128, None)
    with pytest.raises(ValueError, match="OSCAR_SINK_SIZE"):
        plugin.OscarConfig.from_env({"OSCAR_SINK_SIZE": "many"})
    with pytest.raises(ArtifactError, match="--oscar-rotation-path"):
        plugin.OscarConfig(rotation_path=str(tmp_path / "missing")).validate()

    fp = ModelFingerprint(num_layers=2, num_kv_heads=4, num_qo_heads=8, head_dim=32)
    layers = [random_rotation(4, 32, gen) for _ in range(2)]
    art = RotationArtifact(fp, "test", layers)
    d = tmp_path / "rot"
    d.mkdir()
    art.save(d / "a.safetensors")
    for path in (d, d / "a.safetensors"):
        got = plugin.load_rotation_artifact(str(path), fp)
        assert torch.equal(got.layer(1).rot_v, layers[1].rot_v)
    with pytest.raises(ArtifactError, match="another model"):
        plugin.load_rotation_artifact(str(d), dataclasses.replace(fp, num_kv_heads=8))
    art.save(d / "b.safetensors")
    with pytest.raises(ArtifactError, match="expected one .safetensors"):
        plugin.load_rotation_artifact(str(d), fp)
    # the reference RotationZoo pair, per-layer rotations
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for tag, name in (("k", "rot_k"), ("v", "rot_v")):
        torch.save({"format_version": 1, "objective": "oscar",
                    "layers": {str(i): {"rotation": getattr(layers[i], name)[0],
                                        "eigenvalues": torch.rand(32)} for i in range(2)}},
                   zoo / f"{tag}_rotation_test.pt")
    got = plugin.load_rotation_artifact(str(zoo), fp)
    assert torch.equal(got.layer(0).rot_k[0], layers[0].rot_k[0])
    # per-rank slices follow their heads
    per_rank = plugin.rank_rotations(art, tp_rank=1, tp_size=2)
    assert torch.equal(per_rank[1].rot_k, layers[1].rot_k[2:4])
    hada = plugin.load_rotation_artifact(None, fp)
    assert hada.method == "hadamard"


def test_plugin_rejects_unsupported_configs():
    class Args:
        pp_size, enable_hierarchical_cache, speculative_algorithm, dp_size = 2, True, None, 1

    with pytest.raises(UnsupportedConfigError, match="pipeline parallelism.*hierarchical"):
        plugin.check_server_args(Args())
    with pytest.raises(UnsupportedConfigError, match="MLA"):
        plugin.check_model(use_mla=True, head_dim=128, v_head_dim=128,
                           architecture="DeepseekV3ForCausalLM")
    with pytest.raises(UnsupportedConfigError, match="power of two"):
        plugin.check_model(use_mla=False, head_dim=80, v_head_dim=80)
    plugin.check_model(use_mla=False, head_dim=128, v_head_dim=None)


def test_entry_point_declared():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")).read()
    assert '[project.entry-points."sglang.srt.plugins"]' in text
    assert 'oscar_int2 = "oscar_kernels.integrations.sglang:register"' in text


def test_reusable_prefix_len_and_sink_key():
    kw = dict(sink_size=64, recent_size=256)
    assert plugin.reusable_prefix_len(1000, page_size=1, have_sinks=True, **kw) == 744
    assert plugin.reusable_prefix_len(1000, page_size=16, have_sinks=True, **kw) == 736
    assert plugin.reusable_prefix_len(1000, page_size=16, have_sinks=False, **kw) == 0
    assert plugin.reusable_prefix_len(320, page_size=1, have_sinks=True, **kw) == 0
    assert plugin.reusable_prefix_len(321, page_size=1, have_sinks=True, **kw) == 65
    a = plugin.sink_key(list(range(100)), 64)
    assert a == plugin.sink_key(list(range(64)) + [7] * 5, 64)  # only the first 64 count
    assert a != plugin.sink_key(list(range(100)), 64, extra=("lora", 1))
    assert plugin.sink_key(list(range(10)), 64) is None


def test_int2_memory_plan():
    cfg = plugin.OscarConfig(sink_size=64, recent_size=256, tokens_per_request=2048)
    # Qwen3-8B at TP1: INT2 pages 576 B/token/layer + a 320-row BF16 window (4096 B/row/layer)
    # amortized over 2048 tokens per request = 640 B
    cell = plugin.int2_cell_size(num_kv_heads=8, head_dim=128, num_layers=36, config=cfg)
    assert cell == 36 * (576 + 640)
    assert cell < 36 * 4096  # what SGLang would budget for BF16
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=1)
    tokens = 10 ** 6
    rows = plugin.int2_max_running_requests(tokens, 4096, cfg)
    assert rows == tokens // 2048
    used = tokens * spec.int2_bytes_per_token * 36 + rows * spec.window_size * \
        spec.bf16_bytes_per_token * 36
    assert used <= tokens * cell  # pages + windows fit the budget SGLang was told about
    assert plugin.int2_max_running_requests(tokens, 100, cfg) == 100
    env = {}
    cfg.to_env(env)
    assert plugin.OscarConfig.from_env(env).tokens_per_request == 2048
