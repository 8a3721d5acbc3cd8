"""CuTe INT2 decode kernel on an H100/H200 against the reference (``-m gpu``).

The reference (oscar_kernels.reference, float32) runs on the same GPU tensors. A kernel
passes when its error against the reference is within twice the error of a plain bf16
torch computation of the same attention on the same dequantized values (plus a tiny
absolute floor), per sequence. Outputs are poisoned (NaN) before every kernel run.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import make_page_table, poisoned_cache, random_rotation, i32
from oscar_kernels import CacheSpec, ops
from oscar_kernels.errors import BackendUnavailableError

pytestmark = pytest.mark.gpu


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_sm90 = pytest.mark.skipif(not _sm90(), reason="the CuTe kernel needs an sm_90 GPU")


def _fill(spec, seq_lens, gen, num_qo_heads, dev):
    kv_indptr, kv_indices, kv_last, num_pages = make_page_table(seq_lens, spec.page_size, gen)
    cache = poisoned_cache(spec, num_pages, len(seq_lens) + 2, device=dev)
    slots = torch.randperm(len(seq_lens) + 2, generator=gen)[: len(seq_lens)].to(torch.int32)
    rot = random_rotation(spec.num_kv_heads, spec.head_dim, gen, per_head=True)
    n = sum(seq_lens)
    k = torch.randn(n, spec.num_kv_heads, spec.head_dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(n, spec.num_kv_heads, spec.head_dim, generator=gen).to(torch.bfloat16)
    b = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(seq_lens)).to(torch.int32)
    p = torch.cat([torch.arange(x) for x in seq_lens]).to(torch.int32)
    table = [t.to(dev) for t in (kv_indptr, kv_indices, kv_last, slots)]
    rot = rot.to(dev) if hasattr(rot, "to") else rot
    ops.quantize_append_paged_kv_cache(k.to(dev), v.to(dev), b.to(dev), p.to(dev), cache,
                                       table[1], table[0], table[2], table[3], rot,
                                       backend="reference")
    q = torch.randn(len(seq_lens), num_qo_heads, spec.head_dim, generator=gen).to(torch.bfloat16)
    return cache, table, rot, q.to(dev)


def _bf16_attention(q, cache, table, rot, sm_scale):
    """Plain bf16 torch decode on the reference's dequantized/window values (error yardstick)."""
    from oscar_kernels.reference.paged import _sequence_kv, rotate_queries, unrotate_output
    from oscar_kernels.spec import seq_lens_from_page_table

    spec = cache.spec
    kv_indptr, kv_indices, kv_last, slots = table
    rot_k, rot_v = rot.per_head(spec.num_kv_heads)
    lens = seq_lens_from_page_table(kv_indptr, kv_last, spec.page_size)
    qr = rotate_queries(q, rot_k).to(torch.bfloat16)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    g = q.shape[1] // spec.num_kv_heads
    for b in range(q.shape[0]):
        n = int(lens[b])
        if n == 0:
            continue
        k_int2, v_int2, k_full, v_full = _sequence_kv(cache, b, n, kv_indices, kv_indptr,
                                                      slots)
        pos = torch.arange(n, device=q.device)
        full = (pos < spec.sink_size) | (pos >= n - spec.recent_size)
        kk = torch.where(full[:, None, None], k_full, k_int2).to(torch.bfloat16)
        vv = torch.where(full[:, None, None], v_full, v_int2).to(torch.bfloat16)
        kk = kk.repeat_interleave(g, dim=1).transpose(0, 1)    # [Hq, L, D]
        vv = vv.repeat_interleave(g, dim=1).transpose(0, 1)
        s = torch.matmul(qr[b][:, None, :], kk.transpose(1, 2))[:, 0] * sm_scale
        p = torch.softmax(s.float(), dim=-1).to(torch.bfloat16)
        out[b] = torch.matmul(p[:, None, :], vv)[:, 0].float()
    # a plain bf16 computation returns bf16 (q's dtype): round like the kernel's output
    return unrotate_output(out, rot_v).to(q.dtype).float()


def cpu_copy(cache, table, rot, q):
    """The reference runs on the CPU: copies of the GPU cache, page table, rotation, query."""
    from oscar_kernels import Int2PagedKVCache

    c = Int2PagedKVCache(cache.spec, **{n: t.cpu() for n, t in cache.tensors().items()})
    return c, [t.cpu() for t in table], rot.to("cpu"), q.cpu()


def reference_decode(cache, table, rot, q, scale):
    """float32 reference (o, lse) and the bf16 yardstick, computed on the CPU."""
    from oscar_kernels.reference.paged import paged_decode

    c, t, r, qc = cpu_copy(cache, table, rot, q)
    ref32, ref_lse = paged_decode(qc, c, *t, *r.per_head(c.spec.num_kv_heads), scale)
    return ref32, ref_lse, _bf16_attention(qc, c, t, r, scale)


def _check(spec, seq_lens, gqa, seed, *, dtype=torch.bfloat16):
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(seed)
    hq = spec.num_kv_heads * gqa
    cache, table, rot, q = _fill(spec, seq_lens, gen, hq, dev)
    q = q.to(dtype)
    kv_indptr, kv_indices, kv_last, slots = table
    scale = spec.head_dim ** -0.5
    ref32, ref_lse, yard = reference_decode(cache, table, rot, q, scale)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=dev)
    got, lse = ops.paged_decode_attention(q, cache, kv_indptr, kv_indices, kv_last, slots, rot,
                                          out=out, backend="cute", return_lse=True)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    _assert_close(got.cpu(), lse.cpu(), seq_lens, ref32, ref_lse, yard)
    # both builds whatever the plan picked: CTAs of 4 warps, and at head_dim 128 of 8
    from oscar_kernels import cute

    rk, rv = rot.per_head(spec.num_kv_heads)
    # (the any-page build, pages not a multiple of 16, has 4 warps only)
    for warps in (4, 8) if spec.head_dim == 128 and spec.page_size % 16 == 0 else (4,):
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=dev)
        got, lse = cute.decode(q, cache, *table, rk, rv, scale, out=out, warps=warps)
        torch.cuda.synchronize()
        _assert_close(got.cpu(), lse.cpu(), seq_lens, ref32, ref_lse, yard)


def _assert_close(got, lse, seq_lens, ref32, ref_lse, yard):
    for b, n in enumerate(seq_lens):
        if n == 0:
            assert bool((got[b] == 0).all()) and bool(torch.isinf(lse[b]).all())
            continue
        err = (got[b].double() - ref32[b].double()).norm()
        base = (yard[b].double() - ref32[b].double()).norm()
        floor = 1e-3 * ref32[b].double().norm()
        assert bool(torch.isfinite(got[b]).all()), (b, n)
        assert err <= 2 * base + floor, (b, n, float(err), float(base))
        assert torch.allclose(lse[b], ref_lse[b], atol=2e-2, rtol=2e-3), (b, n, lse[b], ref_lse[b])


BOUNDARY_LENS = [1, 15, 16, 17, 63, 64, 65, 113, 319, 320, 321, 337, 1023, 4100]


@needs_sm90
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 3, 4, 8])
@pytest.mark.parametrize("page_size,layout", [(16, "NHD"), (64, "HND"), (32, "NHD"), (16, "HND"),
                                              (1, "NHD"), (8, "HND"), (24, "HND"), (3, "NHD")])
def test_cute_decode_boundaries(head_dim, gqa, page_size, layout):
    """Chunk, page, window and split boundaries; page sizes that are not a multiple of 16
    (1, 3, 8, 24) run the any-page build, whose chunks span several pages."""
    spec = CacheSpec(num_kv_heads=2, head_dim=head_dim, page_size=page_size, kv_layout=layout)
    _check(spec, BOUNDARY_LENS, gqa, seed=head_dim * 100 + gqa * 10 + page_size)


@needs_sm90
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("sink,recent", [(0, 0), (64, 256), (7, 33), (0, 256), (64, 0)])
def test_cute_decode_window_sizes(sink, recent, layout):
    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=16, sink_size=sink,
                     recent_size=recent, kv_layout=layout)
    _check(spec, [1, 40, 300, 2000], 4, seed=sink * 7 + recent)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cute_decode_query_dtypes(dtype):
    spec = CacheSpec(num_kv_heads=1, head_dim=128, page_size=64)
    _check(spec, [700, 3000], 8, seed=5, dtype=dtype)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cute_decode_strided_q_and_out(dtype):
    """q and out as column slices of wider buffers (row strides != head_dim): the kernels
    read q and write o through their strides, nothing outside the slice is touched."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(21)
    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=16)
    cache, table, rot, q = _fill(spec, [900, 37, 2500], gen, 8, dev)
    scale = spec.head_dim ** -0.5
    ref32, _, yard = reference_decode(cache, table, rot, q, scale)
    wide_q = torch.randn(3, 8, 3 * spec.head_dim, device=dev).to(dtype)
    wide_q[:, :, spec.head_dim:2 * spec.head_dim] = q.to(dtype)
    qs = wide_q[:, :, spec.head_dim:2 * spec.head_dim]
    wide_o = torch.full((3, 8, 2 * spec.head_dim), float("nan"), dtype=dtype, device=dev)
    outs = wide_o[:, :, :spec.head_dim]
    got = ops.paged_decode_attention(qs, cache, *table, rot, out=outs, backend="cute")
    torch.cuda.synchronize()
    assert got.data_ptr() == outs.data_ptr()
    assert bool(torch.isnan(wide_o[:, :, spec.head_dim:]).all())
    got = got.float().cpu()
    for b in range(3):
        err = (got[b].double() - ref32[b].double()).norm()
        base = (yard[b].double() - ref32[b].double()).norm()
        # q was rounded to bf16 for the reference; fp16/fp32 copies of it are exact
        assert err <= 2 * base + 1e-3 * ref32[b].double().norm(), (b, float(err), float(base))


@needs_sm90
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("num_splits", [1, 3, 5, 12, 16, 17, 61, 128])
@pytest.mark.parametrize("warps", [4, 8])
def test_cute_decode_num_splits_and_tickets(num_splits, layout, warps):
    """Any split count 1..MAX_SPLITS merges correctly (one split stores o directly in the
    4-warp build; the fused tail in the last CTA of each (sequence, KV head); the merge
    kernel past FUSED_TAIL_ROWS partial rows, 4-warp build only: the 8-warp build refuses
    it by name), and every launch leaves the tickets zero (so repeated calls and graph
    replays start clean)."""
    _splits_case(num_splits, layout, warps, 128, 8)


@needs_sm90
@pytest.mark.parametrize("head_dim,warps", [(64, 4), (128, 4), (128, 8)])
@pytest.mark.parametrize("num_splits", [1, 2, 33, 128])
def test_cute_decode_pair_num_splits(num_splits, head_dim, warps):
    """The same for the pair kernel (GQA 4) at both head_dims: one split (the CTA applies
    R_V^T and stores o), 2 splits (fused tail), 33 and 128 (132 and 512 rows: the merge
    kernel on partials the CTAs rotated)."""
    _splits_case(num_splits, "HND", warps, head_dim, 4)


@needs_sm90
@pytest.mark.parametrize("page_size,layout", [(1, "NHD"), (24, "HND")])
@pytest.mark.parametrize("gqa", [4, 8])
@pytest.mark.parametrize("num_splits", [1, 3, 33, 128])
def test_cute_decode_any_page_num_splits(num_splits, gqa, page_size, layout):
    """The any-page build with one split (R_V^T in the CTA), the fused tail, and the merge
    kernel (33 x 4 or 8 and 128 splits), both GQA classes."""
    _splits_case(num_splits, layout, 4, 128, gqa, page_size)


@needs_sm90
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("merge_ctas", [False, True])
@pytest.mark.parametrize("num_splits", [2, 3, 16, 32])
def test_cute_decode_merge_ctas(num_splits, merge_ctas, gqa):
    """The wide pair build with and without merge CTAs (``decode_pair_mc``: one more CTA
    per (sequence, KV head) polls the splits' count and merges; the splits only count),
    2 to 32 splits (128 partial rows): the same results, the counters zero after every
    call."""
    _splits_case(num_splits, "HND", 8, 128, gqa, merge_ctas=merge_ctas)


@needs_sm90
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("gqa", [1, 3, 4])
@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("num_splits", [1, 3, 8, 16, 40])
def test_cute_decode_ring4(num_splits, warps, gqa, layout):
    """The pair kernel with a 4-deep cp.async ring (``decode_pair_ring4``, 4 and 8 warps;
    the plan runs it for qwen3-8b batch 2-4 and 64) against the reference: 1 to 40 splits
    (the merge kernel above 128 partial rows with 4 warps; a typed error with 8), a
    6000-token sequence, a 1-token and an empty one, both page layouts."""
    _splits_case(num_splits, layout, warps, 128, gqa, ring4=True)


@needs_sm90
def test_cute_decode_ring4_planned():
    """``decode`` without overrides on qwen3-8b's shape (8 KV heads, GQA 4) at batch 2 runs
    the 4-deep ring build by the plan (16 wide splits) and matches the reference."""
    from oscar_kernels.cute import plan as cute_plan

    assert cute_plan.launch_op(2, 8, 4, 128, *cute_plan.plan(2, 8, cute_plan.num_sms("cuda"), 4, 128),
                          torch.device("cuda")) == "decode_pair_ring4"
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=16, kv_layout="HND")
    _check(spec, [9000, 4097], 4, seed=23)


@needs_sm90
@pytest.mark.parametrize("num_kv_heads,gqa,batch,lens", [
    (8, 4, 2, [3000, 17]),     # qwen3-8b: 8 wide splits instead of 16, the 4-deep ring
    (8, 4, 8, [4000] * 7 + [1]),   # 2 splits instead of 4, the 4-deep ring
    (8, 4, 8, [20000, 9000] + [321] * 6),   # 4 splits, the 4-deep ring for 20000
    # batch 7: the shapes plan 4 warps x 9 (WIDE_BUSY_MARGIN), the hint 8 x 4 with the 4-deep
    # ring (WIDE_SHORT_WARP_TOKENS); the 2^30 hint runs the 4-warp plan
    (8, 4, 7, [9000, 300, 4000, 4000, 4000, 17, 4000]),
    (1, 8, 4, [9000, 1, 0, 5000]),  # llama3-70b-tp8: 33 splits instead of 66, merge kernel
    (1, 8, 32, [6000] * 31 + [65]),     # 4 wide splits instead of 8
])
def test_cute_decode_length_hint_plans(num_kv_heads, gqa, batch, lens):
    """The plans the length hint picks (``max_kv_len`` = the longest sequence; each differs
    from the shapes' plan) match the reference through the public op, and so do the plans of
    wrong hints (0, 2^30)."""
    from oscar_kernels.cute import plan as cute_plan

    dev = torch.device("cuda")
    sms = cute_plan.num_sms(dev)
    hint = max(lens)
    assert len(lens) == batch
    shapes = cute_plan.plan(batch, num_kv_heads, sms, gqa, 128)
    hinted = cute_plan.plan(batch, num_kv_heads, sms, gqa, 128, True, hint)
    ops_shapes = [cute_plan.launch_op(batch, num_kv_heads, gqa, 128, *p, dev, max_kv_len=n)
                  for p, n in ((shapes, None), (hinted, hint))]
    assert (hinted, ops_shapes[1]) != (shapes, ops_shapes[0])
    gen = torch.Generator().manual_seed(batch * 7 + gqa)
    spec = CacheSpec(num_kv_heads=num_kv_heads, head_dim=128, page_size=16, kv_layout="HND")
    cache, table, rot, q = _fill(spec, lens, gen, num_kv_heads * gqa, dev)
    scale = spec.head_dim ** -0.5
    ref32, ref_lse, yard = reference_decode(cache, table, rot, q, scale)
    # the true longest sequence, and hints that are wrong both ways (a hint changes the plan,
    # never the result: 0 plans the short-batch choices for sequences of up to 20000 tokens)
    for n in (hint, 0, 1 << 30):
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=dev)
        got, lse = ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                              return_lse=True, max_kv_len=n)
        torch.cuda.synchronize()
        _assert_close(got.cpu(), lse.cpu(), lens, ref32, ref_lse, yard)


@needs_sm90
def test_cute_decode_merge_ctas_cuda_graph():
    """A graph replay of the merge-CTA build gives the eager result (the merge CTAs reset
    their counters, so every replay starts clean)."""
    from oscar_kernels import cute
    from oscar_kernels.cute import workspace

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(41)
    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=16, kv_layout="HND")
    cache, table, rot, q = _fill(spec, [5000, 700, 1], gen, 4, dev)
    rk, rv = rot.per_head(spec.num_kv_heads)
    out = torch.empty_like(q)

    def step():
        cute.decode(q, cache, *table, rk, rv, spec.head_dim ** -0.5, out=out, warps=8,
                    num_splits=6, merge_ctas=True)

    _assert_graph_replays_match(step, out, 3)
    tickets = list(workspace._COUNTERS.values()) + [a[0] for a in workspace._ARENAS.values()]
    assert all(int(t.abs().sum()) == 0 for t in tickets)


@needs_sm90
@pytest.mark.parametrize("merge_ctas", [False, True])
def test_cute_decode_graphs_replayed_concurrently(merge_ctas):
    """Two graphs captured one after the other (torch.cuda.graph's one capture stream),
    replayed at the same time on two streams while eager calls run on a third: every call
    has tickets of its own, so each result is its eager one (a shared ticket would merge
    another call's partials, or leave a merge CTA waiting). Then every ticket is zero."""
    from oscar_kernels import cute
    from oscar_kernels.cute import workspace

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(43)
    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=16, kv_layout="HND")
    cases = []
    for lens in ([9000, 700, 1], [3000, 12000, 50]):
        cache, table, rot, q = _fill(spec, lens, gen, 4, dev)
        rk, rv = rot.per_head(spec.num_kv_heads)
        cases.append((cache, table, rk, rv, q, torch.empty_like(q)))

    def step(k, out=None):
        cache, table, rk, rv, q, o = cases[k]
        cute.decode(q, cache, *table, rk, rv, spec.head_dim ** -0.5,
                    out=o if out is None else out, warps=8, num_splits=8,
                    merge_ctas=merge_ctas)

    want = []
    for k in range(2):
        step(k)
        torch.cuda.synchronize()
        want.append(cases[k][5].clone())
    graphs = []
    for k in range(2):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(k)
        graphs.append(g)
    streams = [torch.cuda.Stream() for _ in range(3)]
    eager_out = torch.empty_like(cases[0][4])
    for _ in range(20):
        for k in range(2):
            cases[k][5].fill_(float("nan"))
        eager_out.fill_(float("nan"))
        torch.cuda.synchronize()
        for k in range(2):
            with torch.cuda.stream(streams[k]):
                graphs[k].replay()
        with torch.cuda.stream(streams[2]):
            step(0, out=eager_out)
        torch.cuda.synchronize()
        for k in range(2):
            assert torch.equal(cases[k][5], want[k])
        assert torch.equal(eager_out, want[0])
    tickets = list(workspace._COUNTERS.values()) + [a[0] for a in workspace._ARENAS.values()]
    assert all(int(t.abs().sum()) == 0 for t in tickets)


def _assert_graph_replays_match(step, out, replays=1):
    """``step`` (which writes ``out``) run eagerly, then captured in a CUDA graph: every
    replay writes the eager result again (``out`` poisoned with NaN before each)."""
    step()
    torch.cuda.synchronize()
    want = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(replays):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


def _splits_case(num_splits, layout, warps, head_dim, gqa, page_size=16, merge_ctas=None,
                 ring4=None):
    from oscar_kernels import cute
    from oscar_kernels.cute import workspace
    from oscar_kernels.cute.config import FUSED_TAIL_ROWS
    from oscar_kernels.errors import UnsupportedConfigError

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(31 + num_splits + warps + head_dim + gqa + page_size)
    spec = CacheSpec(num_kv_heads=1, head_dim=head_dim, page_size=page_size, kv_layout=layout)
    cache, table, rot, q = _fill(spec, [6000, 1, 0, 333], gen, gqa, dev)
    scale = spec.head_dim ** -0.5
    rk, rv = rot.per_head(spec.num_kv_heads)
    if warps == 8 and num_splits * gqa > FUSED_TAIL_ROWS:
        with pytest.raises(UnsupportedConfigError, match="num_splits: the 8-warp build"):
            cute.decode(q, cache, *table, rk, rv, scale, num_splits=num_splits, warps=warps)
        return
    ref32, ref_lse, yard = reference_decode(cache, table, rot, q, scale)
    for _ in range(2):
        out = torch.full_like(q, float("nan"))
        got, lse = cute.decode(q, cache, *table, rk, rv, scale, out=out, num_splits=num_splits,
                               warps=warps, merge_ctas=merge_ctas, ring4=ring4)
        torch.cuda.synchronize()
        assert all(int(t.abs().sum()) == 0 for t in workspace._COUNTERS.values())
        got, lse = got.float().cpu(), lse.cpu()
        for b in range(4):
            if b == 2:
                assert bool((got[b] == 0).all()) and bool(torch.isinf(lse[b]).all())
                continue
            err = (got[b].double() - ref32[b].double()).norm()
            base = (yard[b].double() - ref32[b].double()).norm()
            assert err <= 2 * base + 1e-3 * ref32[b].double().norm(), (b, float(err), float(base))
            assert torch.allclose(lse[b], ref_lse[b], atol=2e-2, rtol=2e-3)


@needs_sm90
def test_cute_decode_rank_weighted_shares():
    """One wave of 256 wide CTAs (8 sequences x 8 KV heads x 4 splits, the plan at batch 8)
    over sequences long enough for rank-weighted shares: the splits of rank 0 (CTA index
    < #SMs) take more INT2 chunks than the others; every chunk is still attended once."""
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=16, kv_layout="HND")
    # RANK_MIN_CHUNKS x 32 warps = 1024 INT2 chunks per sequence and more
    _check(spec, [17000, 24000, 18100, 30000, 16900, 20001, 22222, 19999], 4, seed=17)


@needs_sm90
@pytest.mark.parametrize("batch,seeds,specials", [
    (32, (23, 29), (5, 9, 30)),
    (33, (37, 41), (4, 17, 32))])
def test_cute_decode_rank_weighted_shares_8_splits(batch, seeds, specials):
    """The plans at llama3-70b-tp8 batch 32 and 33 (1 KV head, GQA 8): 8 warps x 8 splits on
    the split-major grid. Batch 32: one wave of 256 CTAs, sequences from below
    RANK_MIN_CHUNKS per warp (equal shares) to far above it (rank-weighted); batch 33: 264
    CTAs, every slot of 132 SMs taken, where the kernel gives every split the same share.
    Each with an empty, a mid-length and a 70000-token sequence."""
    from oscar_kernels.cute import plan as cute_plan

    assert cute_plan.plan(batch, 1, 132, 8, 128, True) == (8, 8)
    gen = torch.Generator().manual_seed(seeds[0])
    lens = torch.randint(300, 40000, (batch,), generator=gen).tolist()
    for i, n in zip(specials, (0, 9500, 70000)):
        lens[i] = n
    spec = CacheSpec(num_kv_heads=1, head_dim=128, page_size=16, kv_layout="HND")
    _check(spec, lens, 8, seed=seeds[1])


@needs_sm90
def test_cute_decode_batch_256():
    gen = torch.Generator().manual_seed(7)
    lens = torch.randint(1, 1500, (256,), generator=gen).tolist()
    lens[3] = 0
    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=16)
    _check(spec, lens, 4, seed=11)


@needs_sm90
@pytest.mark.parametrize("page_size", [64, 1])
def test_cute_decode_batch_1_long(page_size):
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=page_size)
    _check(spec, [33000], 4, seed=3)


@needs_sm90
@pytest.mark.parametrize("page_size", [16, 1])
def test_cute_decode_cuda_graph(page_size):
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(9)
    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=page_size)
    cache, table, rot, q = _fill(spec, [500, 2000, 77], gen, 8, dev)
    out = torch.empty_like(q)

    def step():
        ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                   check_bounds=False)

    _assert_graph_replays_match(step, out)


@needs_sm90
def test_auto_picks_cute_on_sm90():
    from oscar_kernels.ops import _dispatch

    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=16)
    name, _ = _dispatch("decode", "auto", torch.device("cuda"),
                        {"spec": spec, "num_qo_heads": 8, "dtype": torch.bfloat16})
    assert name == "cute"


def _extreme_case(dev, gen):
    """Queries whose heads span 2^-20 .. 2^17 (past fp16's 65504) and BF16 window values
    scaled by 2^17: the kernel's fp16 tensor-core rotations (q @ R_K, o' R_V^T) must scale
    them per head (a power of two) instead of overflowing or flushing."""
    spec = CacheSpec(num_kv_heads=2, head_dim=128, page_size=16)
    cache, table, rot, q = _fill(spec, [40, 700, 2100], gen, 8, dev)
    head_scale = torch.tensor([2.0 ** 17, 2.0 ** -20, 1.0, 32.0] * 2, device=dev)
    q = (q.float() * head_scale[None, :, None]).to(torch.bfloat16)
    cache.v_window.mul_(2.0 ** 17)
    return spec, cache, table, rot, q


@needs_sm90
def test_cute_decode_extreme_magnitudes():
    dev = torch.device("cuda")
    spec, cache, table, rot, q = _extreme_case(dev, torch.Generator().manual_seed(41))
    scale = spec.head_dim ** -0.5
    ref32, ref_lse, yard = reference_decode(cache, table, rot, q, scale)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=dev)
    got, lse = ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                          return_lse=True)
    torch.cuda.synchronize()
    got = got.float().cpu()
    assert bool(torch.isfinite(got).all())
    for b in range(q.shape[0]):
        err = (got[b].double() - ref32[b].double()).norm()
        base = (yard[b].double() - ref32[b].double()).norm()
        assert err <= 2 * base + 1e-3 * ref32[b].double().norm(), (b, float(err), float(base))
