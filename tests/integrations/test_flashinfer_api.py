"""FlashInfer-shaped wrappers: same results as the public ops, graph mode buffers, and typed
errors. The page helpers they re-export are tested in tests/test_page.py."""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch

from helpers import i32, make_page_table, poisoned_cache, random_rotation
from oscar_kernels import CacheSpec, UnsupportedConfigError, ops
from oscar_kernels.errors import BackendUnavailableError
from oscar_kernels.integrations import flashinfer as fi

def _backends():
    """reference always; triton under TRITON_INTERPRET=1 once its kernels implement the ops."""
    out = ["reference"]
    try:
        mod = importlib.import_module("oscar_kernels.triton")
        if hasattr(mod, "decode") and os.environ.get("TRITON_INTERPRET") == "1":
            out.append("triton")
    except ImportError:
        pass
    return out


# --------------------------------------------------------------------- wrappers
def _setup(gen, *, page_size=16, heads=2, gqa=4, head_dim=64, seq_lens=(1, 70, 333),
           layout="NHD", sink=16, recent=32):
    spec = CacheSpec(num_kv_heads=heads, head_dim=head_dim, page_size=page_size,
                     sink_size=sink, recent_size=recent, kv_layout=layout)
    kv_indptr, kv_indices, kv_last, num_pages = make_page_table(list(seq_lens), page_size, gen)
    slots = torch.randperm(len(seq_lens) + 2, generator=gen)[: len(seq_lens)].to(torch.int32)
    cache = poisoned_cache(spec, num_pages, len(seq_lens) + 2)
    rot = random_rotation(heads, head_dim, gen)
    nnz = sum(seq_lens)
    k = torch.randn(nnz, heads, head_dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(nnz, heads, head_dim, generator=gen).to(torch.bfloat16)
    ap = i32([0] + torch.cumsum(torch.tensor(seq_lens), 0).tolist())
    return spec, cache, rot, (kv_indptr, kv_indices, kv_last, slots), ap, k, v


def _clone(cache):
    import dataclasses
    return dataclasses.replace(cache, **{n: t.clone() for n, t in cache.tensors().items()})


# the Triton interpreter is slow on a CPU: one page configuration for it
CONFIGS = [(b, ps, lay) for b in _backends() for ps, lay in ((1, "NHD"), (16, "HND"), (64, "NHD"))
           if b == "reference" or ps == 16]


@pytest.mark.parametrize("backend,page_size,layout", CONFIGS)
def test_append_and_decode_wrapper_equal_ops(backend, page_size, layout, gen):
    spec, cache, rot, (ip, ix, last, slots), ap, k, v = _setup(gen, page_size=page_size,
                                                               layout=layout)
    seq_lens = fi.get_seq_lens(ip, last, page_size)
    b, p = fi.get_batch_indices_positions(ap, seq_lens, k.shape[0])
    ref_cache = _clone(cache)
    fi.append_paged_kv_cache(k, v, b, p, cache, ix, ip, last, layout, window_slots=slots,
                             rotation=rot, backend=backend)
    ops.quantize_append_paged_kv_cache(k, v, b, p, ref_cache, ix, ip, last, slots, rot,
                                       backend=backend)
    # the wrapper is an adapter: same bytes and outputs as the op on the same backend
    # (the backends themselves are compared with the reference in tests/triton, tests/cute)
    for name, t in cache.tensors().items():
        assert torch.equal(t.view(torch.uint8), ref_cache.tensors()[name].view(torch.uint8)), name

    w = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8),
                                                  kv_layout=layout, backend=backend)
    w.plan(ip, ix, last, 8, 2, 64, page_size, window_slots=slots, rotation=rot, sm_scale=0.11)
    q = torch.randn(3, 8, 64, generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    o, lse2 = w.run(q, cache, out=out, return_lse=True)
    want, lse = ops.paged_decode_attention(q, ref_cache, ip, ix, last, slots, rot, sm_scale=0.11,
                                           return_lse=True, backend=backend)
    assert o is out and bool(torch.isfinite(o.float()).all())
    assert torch.equal(o, want)
    torch.testing.assert_close(lse2, lse / math.log(2.0), atol=0, rtol=1e-6)
    _, lse_ln = w.run(q, cache, return_lse=True, lse_base="ln")
    assert torch.equal(lse_ln, lse)
    if backend != "reference":  # and the backend is close to the spec
        spec_o = ops.paged_decode_attention(q, ref_cache, ip, ix, last, slots, rot,
                                            sm_scale=0.11, backend="reference")
        torch.testing.assert_close(o.float(), spec_o.float(), atol=3e-2, rtol=3e-2)


def test_decode_wrapper_passes_the_longest_sequence_as_hint(gen, monkeypatch):
    """Eager plans hand the batch's longest sequence to the op as its length hint
    (``max_kv_len``); under CUDA graphs none (a captured launch serves every later length)."""
    spec, cache, rot, (ip, ix, last, slots), ap, k, v = _setup(gen, seq_lens=(40, 90, 7))
    seen = []
    real = ops.paged_decode_attention
    monkeypatch.setattr(ops, "paged_decode_attention",
                        lambda *a, **kw: seen.append(kw["max_kv_len"]) or real(*a, **kw))
    q = torch.randn(3, 4, 64, generator=gen).to(torch.bfloat16)
    w = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), backend="reference")
    w.plan(ip, ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot)
    w.run(q, cache)
    bufs = (torch.empty(4, dtype=torch.int32), torch.empty(64, dtype=torch.int32),
            torch.empty(3, dtype=torch.int32))
    g = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), "NHD", True, False, *bufs,
                                                  backend="reference")
    g.plan(ip, ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot)
    g.run(q, cache)
    assert seen == [int(fi.get_seq_lens(ip, last, 16).max()), None] == [90, None]


def test_decode_wrapper_one_plan_many_layers(gen):
    """One plan per forward; each layer passes its own cache and rotation to run()."""
    spec, cache0, rot0, (ip, ix, last, slots), ap, k, v = _setup(gen)
    cache1 = _clone(cache0)
    rot1 = random_rotation(2, 64, gen, per_head=False)
    b, p = fi.get_batch_indices_positions(ap, fi.get_seq_lens(ip, last, 16), k.shape[0])
    for c, r in ((cache0, rot0), (cache1, rot1)):
        fi.append_paged_kv_cache(k, v, b, p, c, ix, ip, last, window_slots=slots, rotation=r)
    w = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), backend="reference")
    w.plan(ip, ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot0)
    q = torch.randn(3, 4, 64, generator=gen).to(torch.bfloat16)
    o0 = w.run(q, cache0)
    o1 = w.run(q, cache1, rotation=rot1)
    assert torch.equal(o0, ops.paged_decode_attention(q, cache0, ip, ix, last, slots, rot0,
                                                      backend="reference"))
    assert torch.equal(o1, ops.paged_decode_attention(q, cache1, ip, ix, last, slots, rot1,
                                                      backend="reference"))
    assert not torch.equal(o0, o1)


def test_cuda_graph_mode_reads_persistent_buffers(gen):
    """use_cuda_graph=True: plan copies into the user's buffers, run reads those buffers
    (so a graph captured once replays any later plan of the same batch size)."""
    spec, cache, rot, (ip, ix, last, slots), ap, k, v = _setup(gen, seq_lens=(40, 90, 7))
    b, p = fi.get_batch_indices_positions(ap, fi.get_seq_lens(ip, last, 16), k.shape[0])
    fi.append_paged_kv_cache(k, v, b, p, cache, ix, ip, last, window_slots=slots, rotation=rot)
    bufs = (torch.full((4,), -7, dtype=torch.int32), torch.full((64,), -7, dtype=torch.int32),
            torch.full((3,), -7, dtype=torch.int32))
    w = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), "NHD", True, False, *bufs,
                                                  backend="reference")
    assert w.is_cuda_graph_enabled
    q = torch.randn(3, 4, 64, generator=gen).to(torch.bfloat16)
    # plan a shorter view of the same sequences (drop the last token of each), then the full one
    short_last = last - 1
    short_ip = ip.clone()
    for i in range(3):
        if int(short_last[i]) == 0:
            short_ip[i + 1:] -= 1
            short_last[i] = 16
    short_ix = torch.cat([ix[int(ip[i]):int(ip[i]) + int(short_ip[i + 1] - short_ip[i])]
                          for i in range(3)])
    for table in ((short_ip, short_ix, short_last), (ip, ix, last)):
        w.plan(*table, 4, 2, 64, 16, window_slots=slots, rotation=rot)
        assert torch.equal(bufs[0], table[0]) and torch.equal(bufs[2], table[2])
        assert torch.equal(bufs[1][: table[1].shape[0]], table[1])
    o = w.run(q, cache)
    assert torch.equal(o, ops.paged_decode_attention(q, cache, ip, ix, last, slots, rot,
                                                     backend="reference"))
    with pytest.raises(ValueError, match="batch_size 3"):
        w.plan(ip[:3], ix, last[:2], 4, 2, 64, 16, window_slots=slots[:2], rotation=rot)
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer"):
        fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), "NHD", True, False, None,
                                                  bufs[1], bufs[2])


@pytest.mark.parametrize("backend", _backends())
def test_prefill_wrapper_chunked_equals_ops_and_decode(backend, gen):
    """Chunked prefill through the wrapper = ops.paged_extend_attention; then decode."""
    heads, d, page_size = 2, 64, 16
    spec = CacheSpec(num_kv_heads=heads, head_dim=d, page_size=page_size, sink_size=8,
                     recent_size=24)
    lens = [30, 45]
    ip_full, ix_full, last_full, num_pages = make_page_table(lens, page_size, gen)
    slots = i32([1, 0])
    rot = random_rotation(heads, d, gen)
    cache = poisoned_cache(spec, num_pages, 2)
    ref = _clone(cache)
    ks = [torch.randn(n, heads, d, generator=gen).to(torch.bfloat16) for n in lens]
    vs = [torch.randn(n, heads, d, generator=gen).to(torch.bfloat16) for n in lens]
    qs = [torch.randn(n, 8, d, generator=gen).to(torch.bfloat16) for n in lens]
    w = fi.Int2BatchPrefillWithPagedKVCacheWrapper(torch.empty(0), backend=backend)
    done = [0, 0]
    for chunk in ([12, 20], [18, 25]):
        qo = i32([0, chunk[0], chunk[0] + chunk[1]])
        now = [done[i] + chunk[i] for i in range(2)]
        npages = [-(-n // page_size) for n in now]
        ip = i32([0, npages[0], npages[0] + npages[1]])
        ix = torch.cat([ix_full[int(ip_full[i]):int(ip_full[i]) + npages[i]] for i in range(2)])
        last = i32([(n - 1) % page_size + 1 for n in now])
        w.plan(qo, ip, ix, last, 8, heads, d, page_size, causal=True, window_slots=slots,
               rotation=rot)
        sl = [slice(done[i], now[i]) for i in range(2)]
        q = torch.cat([qs[i][sl[i]] for i in range(2)])
        k = torch.cat([ks[i][sl[i]] for i in range(2)])
        v = torch.cat([vs[i][sl[i]] for i in range(2)])
        o = w.run(q, k, v, cache)
        want = ops.paged_extend_attention(q, k, v, qo, ref, ip, ix, last, slots, rot,
                                          backend=backend)
        assert torch.equal(o, want)
        done = now
    for name, t in cache.tensors().items():
        assert torch.equal(t.view(torch.uint8), ref.tensors()[name].view(torch.uint8)), name


# ------------------------------------------------------------------------ errors
def test_wrapper_errors_are_typed_and_named(gen):
    spec, cache, rot, (ip, ix, last, slots), ap, k, v = _setup(gen)
    w = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), backend="reference")
    q = torch.randn(3, 4, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="plan"):
        w.run(q, cache)
    with pytest.raises(ValueError, match="window_slots.*distinct"):
        w.plan(ip, ix, last, 4, 2, 64, 16, window_slots=i32([0, 0, 1]), rotation=rot)
    with pytest.raises(TypeError, match="indptr.*int32"):
        w.plan(ip.long(), ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot)
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(ip, ix, last + 16, 4, 2, 64, 16, window_slots=slots, rotation=rot)
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(ip, ix, last, 3, 2, 64, 16, window_slots=slots, rotation=rot)
    with pytest.raises(UnsupportedConfigError, match="pos_encoding_mode"):
        w.plan(ip, ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot,
               pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(UnsupportedConfigError, match="window_left"):
        w.plan(ip, ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot, window_left=128)
    w.plan(ip, ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot)
    with pytest.raises(ValueError, match="q: expected shape"):
        w.run(q[:2], cache)
    small = poisoned_cache(spec, int(ix.max()), 8)
    with pytest.raises(ValueError, match="largest page id"):
        w.run(q, small)
    hnd = poisoned_cache(CacheSpec(num_kv_heads=2, head_dim=64, page_size=16, kv_layout="HND",
                                   sink_size=16, recent_size=32), cache.num_pages, 8)
    with pytest.raises(ValueError, match="kv_layout"):
        w.run(q, hnd)
    with pytest.raises(ValueError, match="kv_layout"):
        b, p = fi.get_batch_indices_positions(ap, fi.get_seq_lens(ip, last, 16), k.shape[0])
        fi.append_paged_kv_cache(k, v, b, p, cache, ix, ip, last, "HND", window_slots=slots,
                                 rotation=rot)
    pw = fi.Int2BatchPrefillWithPagedKVCacheWrapper(torch.empty(0))
    with pytest.raises(UnsupportedConfigError, match="causal"):
        pw.plan(ap, ip, ix, last, 4, 2, 64, 16, causal=False, window_slots=slots, rotation=rot)
    with pytest.raises(ValueError, match="qo_indptr"):
        pw.plan(ap + 1, ip, ix, last, 4, 2, 64, 16, window_slots=slots, rotation=rot)
    with pytest.raises(ValueError, match="kv_layout"):
        fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), kv_layout="NDH")


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "triton", "cute"])
def test_wrappers_on_gpu_match_reference(backend, gen):
    spec, cache, rot, (ip, ix, last, slots), ap, k, v = _setup(
        gen, page_size=16, heads=8, gqa=4, head_dim=128, seq_lens=(1, 700, 4000),
        sink=64, recent=256)
    dev = torch.device("cuda")
    try:
        ops._dispatch("decode", backend, dev, {"spec": spec, "num_qo_heads": 32,
                                               "dtype": torch.bfloat16})
    except (UnsupportedConfigError, BackendUnavailableError) as exc:
        pytest.skip(f"backend {backend} cannot run this config here: {exc}")
    b, p = fi.get_batch_indices_positions(ap, fi.get_seq_lens(ip, last, 16), k.shape[0])
    ref = _clone(cache)
    ops.quantize_append_paged_kv_cache(k, v, b, p, ref, ix, ip, last, slots, rot,
                                       backend="reference")
    gcache = _clone(ref)
    for name, t in gcache.tensors().items():
        setattr(gcache, name, t.to(dev))
    ipg, ixg, lastg, slotsg = (t.to(dev) for t in (ip, ix, last, slots))
    bufs = (torch.empty(4, dtype=torch.int32, device=dev),
            torch.empty(ix.shape[0] + 8, dtype=torch.int32, device=dev),
            torch.empty(3, dtype=torch.int32, device=dev))
    w = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8,
                                                              device=dev), "NHD", True, False,
                                                  *bufs, backend=backend)
    w.plan(ipg, ixg, lastg, 32, 8, 128, 16, window_slots=slotsg, rotation=rot, spec=spec)
    q = torch.randn(3, 32, 128, generator=gen).to(torch.bfloat16)
    want = ops.paged_decode_attention(q, ref, ip, ix, last, slots, rot, backend="reference")
    out = torch.full((3, 32, 128), float("nan"), dtype=torch.bfloat16, device=dev)
    qg = q.to(dev)
    w.run(qg, gcache, out=out)  # warm-up outside the graph
    g = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(g):
        w.run(qg, gcache, out=out)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
