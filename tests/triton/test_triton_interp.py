"""Triton kernels under the CPU interpreter (TRITON_INTERPRET=1, set in tests/conftest.py)
against the torch reference, on small shapes: codes/params/windows of the append kernel,
decode and extend outputs and lse, and the cache state extend leaves behind.

Budget for the fused rotation (a different fp32 summation order than the reference's
einsum): at most 1e-3 of the codes may differ, each by one level; a stored fp16/fp32
scale or zero may differ by one unit in the last place of fp16 storage, or by 1e-5 relative
in fp32 storage.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from helpers import rel_err
from oscar_kernels import CacheSpec, ops
from oscar_kernels.errors import BackendUnavailableError, UnsupportedConfigError
from oscar_kernels.reference import paged as ref
from triton_cases import (build_case, compare_codes, offsets, rot_heads, used_pages)

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                       reason="interpreter tests run on CPU-only machines with TRITON_INTERPRET=1"),
    # numpy's deprecation of array-to-scalar conversion inside triton's interpreter
    pytest.mark.filterwarnings("ignore::DeprecationWarning:triton.runtime.interpreter"),
]
triton = pytest.importorskip("triton")

CODE_FLIP_BUDGET = 1e-3


def _spec(d, h, ps, g=None, layout="NHD", scale_dtype=torch.float16, sink=8, recent=16):
    return CacheSpec(num_kv_heads=h, head_dim=d, page_size=ps, group_size=g, sink_size=sink,
                     recent_size=recent, kv_layout=layout, scale_dtype=scale_dtype)


def _check_params(a, b, dtype):
    # fp16: one unit in the last place; fp32 (no storage rounding to hide the summation-order
    # difference of the rotation): 1e-5 relative to the group's value
    eps = torch.finfo(dtype).eps if dtype == torch.float16 else 1e-5
    a, b = a.float(), b.float()
    assert torch.equal(a.isnan(), b.isnan())
    fin = ~a.isnan()
    tol = eps * b[fin].abs().clamp_min(torch.finfo(dtype).tiny) * 1.01
    assert bool(((a[fin] - b[fin]).abs() <= tol).all()), float((a[fin] - b[fin]).abs().max())


def _append_both(spec, lens, gen, *, inject=False):
    case = build_case(spec, lens, spec.num_kv_heads, gen, prefix_lens=[0] * len(lens))
    k, v = case["k"].clone(), case["v"].clone()
    if inject:
        k[3, 0] = 0.0                      # constant after rotation: scale 0, codes 0
        v[5, -1, 7] = float("nan")         # a NaN token-head: scale = zero = NaN
        k[9, 0, 0] = float("inf")
    batch = len(lens)
    bi = torch.repeat_interleave(torch.arange(batch), torch.tensor(lens)).to(torch.int32)
    pos = torch.cat([torch.arange(n) for n in lens]).to(torch.int32)
    tab = (case["kv_indices"], case["kv_indptr"], case["kv_last_page_len"], case["window_slots"])
    caches = {}
    for backend in ("triton", "reference"):
        cache = build_case(spec, lens, spec.num_kv_heads, torch.Generator().manual_seed(1),
                           prefix_lens=[0] * len(lens))["cache"]
        ops.quantize_append_paged_kv_cache(k, v, bi, pos, cache, *tab, case["rot"],
                                           backend=backend)
        caches[backend] = cache
    return case, caches["triton"], caches["reference"]


# the launcher's three plans (append_plan): 16-token tiles, one-token programs with 16-row
# R tiles, one-token programs with R in one tile of up to 128 rows
APPEND_PLANS = {"tile16": dict(TOKEN_PROGRAMS_PER_SM=0),
                "token_r16": dict(TOKEN_PROGRAMS_PER_SM=10 ** 6, WIDE_TILE_PROGRAMS_PER_SM=0),
                "token_wide": dict(TOKEN_PROGRAMS_PER_SM=10 ** 6,
                                   WIDE_TILE_PROGRAMS_PER_SM=10 ** 6)}


@pytest.mark.parametrize("plan", list(APPEND_PLANS))
@pytest.mark.parametrize("d,h,ps,g,layout,sdt,lens", [
    (64, 2, 16, None, "NHD", torch.float16, [3, 40, 29]),
    (64, 3, 1, 16, "HND", torch.float32, [3, 40, 29]),
    (128, 1, 7, 32, "NHD", torch.float16, [3, 20, 9]),
])
def test_append_matches_reference(d, h, ps, g, layout, sdt, lens, plan, monkeypatch):
    from oscar_kernels.triton import quantize_append as qa
    for name, value in APPEND_PLANS[plan].items():
        monkeypatch.setattr(qa, name, value)
    nnz = sum(lens)
    want = (16, 16) if plan == "tile16" else (1, 16 if plan == "token_r16" else d)
    assert qa.append_plan(nnz, h, d, torch.device("cpu")) == want
    gen = torch.Generator().manual_seed(11 + d + ps)
    spec = _spec(d, h, ps, g, layout, sdt)
    case, tri, refc = _append_both(spec, lens, gen, inject=True)
    pages = used_pages(case)
    for name in ("k", "v"):
        frac, worst = compare_codes(getattr(tri, f"{name}_codes")[pages],
                                    getattr(refc, f"{name}_codes")[pages])
        assert frac <= CODE_FLIP_BUDGET and worst <= 1, (name, frac, worst)
        _check_params(getattr(tri, f"{name}_params")[pages], getattr(refc, f"{name}_params")[pages],
                      sdt)
        # window rows that the append must have written: sink rows and the recent ring
        for b, n in enumerate(lens):
            slot = int(case["window_slots"][b])
            rows = sorted({p if p < spec.sink_size else spec.sink_size + p % spec.recent_size
                           for p in range(n)
                           if p < spec.sink_size or p >= n - spec.recent_size})
            a = getattr(tri, f"{name}_window")[slot, rows].float()
            r = getattr(refc, f"{name}_window")[slot, rows].float()
            assert torch.equal(torch.isfinite(a), torch.isfinite(r))
            fin = torch.isfinite(r)
            assert bool(((a[fin] - r[fin]).abs() <= r[fin].abs() * 2 ** -7 + 1e-6).all())


def test_append_plan_thresholds():
    """The launcher's plan by program count (nnz x heads x K/V) on 132 SMs (the CPU
    default): one-token programs with R in one tile up to 264, with 16-row tiles up to 792,
    16-token tiles above; R's wide tile is 128 elements per thread of 4 warps."""
    from oscar_kernels.triton import quantize_append as qa
    cpu = torch.device("cpu")
    assert qa.DEFAULT_SM_COUNT == 132
    assert qa.append_plan(1, 8, 128, cpu) == (1, 128)
    assert qa.append_plan(16, 8, 128, cpu) == (1, 128)        # 256 programs
    assert qa.append_plan(17, 8, 128, cpu) == (1, 16)         # 272
    assert qa.append_plan(49, 8, 128, cpu) == (1, 16)         # 784
    assert qa.append_plan(50, 8, 128, cpu) == (16, 16)        # 800
    assert qa.append_plan(132, 1, 128, cpu) == (1, 128)
    assert qa.append_plan(396, 1, 64, cpu) == (1, 16)
    assert qa.append_plan(397, 1, 64, cpu) == (16, 16)
    assert [qa.append_plan(1, 1, d, cpu)[1] for d in (16, 32, 64, 128, 256)] == [
        16, 32, 64, 128, 64]


def test_append_constant_and_nonfinite_groups_exact():
    gen = torch.Generator().manual_seed(5)
    spec = _spec(64, 2, 16, 32)
    case, tri, refc = _append_both(spec, [12], gen, inject=True)
    page = case["kv_indices"].long()
    kp = tri.k_params[page].reshape(-1, 2, 2, 2)
    vp = tri.v_params[page].reshape(-1, 2, 2, 2)
    assert torch.equal(kp[3, 0], torch.zeros(2, 2, dtype=kp.dtype))     # constant: 0, 0
    assert bool(kp[9, 0].isnan().all()) and bool(vp[5, 1].isnan().all())
    assert not bool(kp[9, 1].isnan().any()) and not bool(vp[5, 0].isnan().any())
    assert int(tri.k_codes[page].reshape(-1, 2, 16)[3, 0].max()) == 0
    assert int(tri.v_codes[page].reshape(-1, 2, 16)[5, 1].max()) == 0


@pytest.mark.parametrize("d,h,gqa,ps,g,layout,sdt", [
    (64, 2, 4, 16, None, "NHD", torch.float16),
    (128, 1, 3, 5, 32, "HND", torch.float16),
    (64, 2, 1, 1, 32, "NHD", torch.float32),
])
def test_decode_matches_reference(d, h, gqa, ps, g, layout, sdt):
    gen = torch.Generator().manual_seed(100 + d + gqa)
    spec = _spec(d, h, ps, g, layout, sdt)
    lens = [0, 1, 15, 113]
    case = build_case(spec, lens, h * gqa, gen)
    tab = (case["kv_indptr"], case["kv_indices"], case["kv_last_page_len"], case["window_slots"])
    q = case["q"].float()
    out = torch.full_like(q, float("nan"))
    o, lse = ops.paged_decode_attention(q, case["cache"], *tab, case["rot"], out=out,
                                        return_lse=True, backend="triton")
    o_ref, lse_ref = ops.paged_decode_attention(q, case["cache"], *tab, case["rot"],
                                                return_lse=True, backend="reference")
    assert o.data_ptr() == out.data_ptr() and not bool(out.isnan().any())
    assert rel_err(o, o_ref) < 1e-5
    from oscar_kernels.triton.paged_decode import (default_decode_config,
                                                       paged_decode_attention_triton)

    cfg = dataclasses.replace(default_decode_config(q.device), rotate_in_kernel=False)
    rk, rv = case["rot"].per_head(h)
    o2, _ = paged_decode_attention_triton(q, case["cache"], *tab, rk, rv, d ** -0.5, config=cfg)
    assert rel_err(o2, o_ref) < 1e-5
    # column-major rotations (no copy: the kernels take both strides), merge un-rotating
    cfg = dataclasses.replace(default_decode_config(q.device), unrotate_in_split=False)
    rk_t, rv_t = (r.transpose(-1, -2).contiguous().transpose(-1, -2) for r in (rk, rv))
    assert rk_t.stride(-1) != 1
    o3, _ = paged_decode_attention_triton(q, case["cache"], *tab, rk_t, rv_t, d ** -0.5,
                                          config=cfg)
    assert rel_err(o3, o_ref) < 1e-5
    assert torch.equal(lse[0], lse_ref[0]) and bool(torch.isinf(lse[0]).all())
    assert float((lse[1:] - lse_ref[1:]).abs().max()) < 1e-4
    assert float(o[0].abs().max()) == 0.0


def test_extend_int2_part_rule():
    """The wide-tile INT2 kernel runs when its grid has a program per SM (132 off the GPU):
    64 rows = 16 queries at GQA 4, 8 at GQA 8, 64 at GQA 1."""
    from oscar_kernels.triton import paged_extend as pe
    cpu = torch.device("cpu")
    assert pe.EXTEND_INT2_BLOCK_M == 64 and pe.EXTEND_INT2_MIN_PROGRAMS_PER_SM == 1
    assert pe.extend_int2_part(4096, 8, 1, 4, cpu)             # 256 x 8 programs
    assert not pe.extend_int2_part(256, 8, 1, 4, cpu)          # 16 x 8 = 128 < 132
    assert pe.extend_int2_part(264, 8, 1, 4, cpu)              # 17 x 8 = 136
    assert pe.extend_int2_part(16, 8, 17, 4, cpu)              # 1 x 8 x 17 = 136
    assert not pe.extend_int2_part(1048, 1, 1, 8, cpu)         # 131 programs
    assert pe.extend_int2_part(1056, 1, 1, 8, cpu)             # 132
    assert not pe.extend_int2_part(8383, 1, 1, 1, cpu)         # 131
    assert pe.extend_int2_part(8385, 1, 1, 1, cpu)             # 132


ONE_GROUP, FOUR_GROUPS = (64, 2, 4, 16, None, "NHD"), (64, 1, 3, 4, 16, "HND")


@pytest.mark.parametrize("d,h,gqa,ps,g,layout,int2_part", [
    (*ONE_GROUP, False), (*ONE_GROUP, True), (*ONE_GROUP, "quarters"),
    (*FOUR_GROUPS, False), (*FOUR_GROUPS, True), (*ONE_GROUP, "dense"), (*FOUR_GROUPS, "dense"),
    (*ONE_GROUP, "dense_tiles"),
], ids=["one_group-one_kernel", "one_group-int2_part", "one_group-int2_part_quarters",
        "four_groups-one_kernel", "four_groups-int2_part", "one_group-dense", "four_groups-dense",
        "one_group-dense_tiles"])
def test_extend_matches_reference(d, h, gqa, ps, g, layout, int2_part, monkeypatch):
    """Every launcher path: one kernel for everything, or the INT2 pages attended first in
    wide tiles (_extend_int2_kernel: whole-row dots with one group per token, quarter dots
    with several or when forced) or as dequantize + dense attention (extend_dense: fp16
    dequantized rows and query, so a looser bound), and merged by the main kernel."""
    from oscar_kernels.triton import paged_extend as pe
    monkeypatch.setattr(pe, "EXTEND_INT2_MIN_PROGRAMS_PER_SM", 0 if int2_part else 10 ** 9)
    monkeypatch.setattr(pe, "EXTEND_INT2_WHOLE", int2_part is True)
    dense = int2_part in ("dense", "dense_tiles")
    monkeypatch.setattr(pe, "EXTEND_INT2_DENSE", dense)
    if int2_part == "dense_tiles":                    # the keys every query sees, in 4-row tiles
        from oscar_kernels.triton import extend_dense
        monkeypatch.setattr(extend_dense, "DENSE_TILE_TOKENS", 4)
    gen = torch.Generator().manual_seed(200 + gqa)
    spec = _spec(d, h, ps, g, layout)
    lens, chunks = [9, 70, 40], [9, 37, 3]           # a whole-prompt chunk, a chunk > W
    prefix = [n - c for n, c in zip(lens, chunks)]
    state = {}
    for backend in ("triton", "reference"):
        case = build_case(spec, lens, h * gqa, torch.Generator().manual_seed(7), prefix_lens=prefix)
        sel = torch.cat([torch.arange(o + p, o + n) for o, p, n in zip(offsets(lens), prefix, lens)])
        qo = torch.tensor([0] + list(torch.tensor(chunks).cumsum(0)), dtype=torch.int32)
        q = torch.randn(len(sel), h * gqa, d, generator=torch.Generator().manual_seed(8))
        out = torch.full_like(q, float("nan"))
        o, lse = ops.paged_extend_attention(
            q, case["k"][sel], case["v"][sel], qo, case["cache"], case["kv_indptr"],
            case["kv_indices"], case["kv_last_page_len"], case["window_slots"], case["rot"],
            out=out, return_lse=True, backend=backend)
        assert not bool(o.isnan().any())
        state[backend] = (o, lse, case)
    o_t, lse_t, ct = state["triton"]
    o_r, lse_r, cr = state["reference"]
    assert rel_err(o_t, o_r) < (2e-3 if dense else 1e-5)
    assert float((lse_t - lse_r).abs().max()) < (2e-3 if dense else 1e-4)
    pages = used_pages(ct)
    for name in ("k", "v"):
        frac, worst = compare_codes(getattr(ct["cache"], f"{name}_codes")[pages],
                                    getattr(cr["cache"], f"{name}_codes")[pages])
        assert frac <= CODE_FLIP_BUDGET and worst <= 1
        for b, n in enumerate(lens):
            slot = int(ct["window_slots"][b])
            rows = sorted({p if p < spec.sink_size else spec.sink_size + p % spec.recent_size
                           for p in range(n) if p < spec.sink_size or p >= n - spec.recent_size})
            a = getattr(ct["cache"], f"{name}_window")[slot, rows].float()
            r = getattr(cr["cache"], f"{name}_window")[slot, rows].float()
            assert bool(((a - r).abs() <= r.abs() * 2 ** -7 + 1e-6).all())


@pytest.mark.parametrize("dense", [False, True], ids=["kernels", "dense"])
def test_extend_plan_shared_by_layers(dense, monkeypatch):
    """One ``ops.plan_extend`` per batch serves every layer: two layers (caches of the same
    spec and page table, different queries) extended with the shared plan give
    bit-identical outputs, lse and cache bytes to calls that plan for themselves; a plan of
    another batch is refused."""
    from oscar_kernels.triton import paged_extend as pe
    monkeypatch.setattr(pe, "EXTEND_INT2_DENSE", dense)
    d, h, gqa, ps, g, layout = ONE_GROUP
    spec = _spec(d, h, ps, g, layout)
    lens, chunks = [70, 40], [37, 40]
    prefix = [n - c for n, c in zip(lens, chunks)]
    qo = torch.tensor([0] + list(torch.tensor(chunks).cumsum(0)), dtype=torch.int32)
    results = {}
    for shared in (False, True):
        outs = []
        plan = None
        for layer in range(2):
            case = build_case(spec, lens, h * gqa,
                              torch.Generator().manual_seed(30), prefix_lens=prefix)
            sel = torch.cat([torch.arange(o + p, o + n)
                             for o, p, n in zip(offsets(lens), prefix, lens)])
            q = torch.randn(len(sel), h * gqa, d,
                            generator=torch.Generator().manual_seed(40 + layer))
            table = (case["kv_indptr"], case["kv_indices"], case["kv_last_page_len"],
                     case["window_slots"])
            if shared and plan is None:
                plan = ops.plan_extend(qo, case["cache"], table[0], table[2], table[3])
                assert plan.dense == dense
            o, lse = ops.paged_extend_attention(
                q, case["k"][sel], case["v"][sel], qo, case["cache"], *table, case["rot"],
                return_lse=True, backend="triton", plan=plan if shared else None)
            outs.append((o, lse, case["cache"]))
        results[shared] = outs
    for (o1, l1, c1), (o2, l2, c2) in zip(results[False], results[True]):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)
        for name, t in c1.tensors().items():                 # bytes (unused rows are NaN)
            assert torch.equal(t.contiguous().view(torch.uint8),
                               c2.tensors()[name].contiguous().view(torch.uint8)), name
    other = ops.plan_extend(torch.tensor([0, 37], dtype=torch.int32), c1,
                            torch.tensor([0, 5], dtype=torch.int32),
                            torch.tensor([6], dtype=torch.int32),
                            torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="plan"):
        ops.paged_extend_attention(
            q, case["k"][sel], case["v"][sel], qo, case["cache"], *table, case["rot"],
            backend="triton", plan=other)


@pytest.mark.parametrize("layout,g", [("NHD", None), ("HND", 16)])
def test_dequantize_rows_matches_reference(layout, g):
    """The dense extend's dequantize kernel: ``zero + scale * code`` of every row of a
    sequence's range, bit-exact against the reference dequantization rounded to fp16."""
    from oscar_kernels.reference.quant import dequantize_groups, unpack_codes
    from oscar_kernels.triton.extend_dense import dequantize_rows
    spec = _spec(64, 2, 4, g, layout, sink=8, recent=16)
    lens = [23, 61]
    case = build_case(spec, lens, 2, torch.Generator().manual_seed(11))
    cache = case["cache"]
    b, pos0, count = 1, 5, 50
    first = int(case["kv_indptr"][b])
    for codes, params in ((cache.k_codes, cache.k_params), (cache.v_codes, cache.v_params)):
        out = torch.full((2, 64, 64), float("nan"), dtype=torch.float16)
        dequantize_rows(codes, params, layout, case["kv_indices"], first, pos0, count,
                        spec.page_size, spec.num_groups, out)
        for i in range(count):
            page = int(case["kv_indices"][first + (pos0 + i) // 4])
            slot = (pos0 + i) % 4
            for hh in range(2):
                c = codes[page, slot, hh] if layout == "NHD" else codes[page, hh, slot]
                pr = params[page, slot, hh] if layout == "NHD" else params[page, hh, slot]
                ref_row = dequantize_groups(unpack_codes(c), pr[..., 0], pr[..., 1],
                                            spec.group_size).to(torch.float16)
                assert torch.equal(out[hh, i], ref_row), (i, hh)
        assert bool(out[:, count:].isnan().all())      # rows past the range untouched


def test_decode_after_triton_append_matches_reference_decode():
    """The two Triton kernels chained (append then decode) against the reference chain."""
    gen = torch.Generator().manual_seed(3)
    spec = _spec(64, 2, 16)
    lens = [50, 26]
    case, tri, refc = _append_both(spec, lens, gen)
    tab = (case["kv_indptr"], case["kv_indices"], case["kv_last_page_len"], case["window_slots"])
    q = case["q"].float().repeat_interleave(2, dim=1)
    o_t = ops.paged_decode_attention(q, tri, *tab, case["rot"], backend="triton")
    o_r = ops.paged_decode_attention(q, refc, *tab, case["rot"], backend="reference")
    assert rel_err(o_t, o_r) < 2e-3


def test_can_implement_reports_unsupported_and_unavailable(monkeypatch):
    from oscar_kernels import triton as triton_backend

    cpu = torch.device("cpu")
    triton_backend.can_implement("decode", device=cpu, spec=_spec(128, 2, 16, 32),
                             num_qo_heads=8, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedConfigError, match="group_size"):
        triton_backend.can_implement("decode", device=cpu, spec=_spec(128, 2, 16, 16),
                                 num_qo_heads=8, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedConfigError, match="head_dim"):
        triton_backend.can_implement("extend", device=cpu, spec=_spec(32, 2, 16),
                                 num_qo_heads=8, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedConfigError, match="num_qo_heads"):
        triton_backend.can_implement("decode", device=cpu, spec=_spec(64, 1, 16),
                                 num_qo_heads=32, dtype=torch.bfloat16)
    triton_backend.can_implement("append", device=cpu, spec=_spec(128, 2, 16, 16),
                             num_qo_heads=2, dtype=torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET"):
        triton_backend.can_implement("decode", device=cpu, spec=_spec(64, 2, 16),
                                 num_qo_heads=8, dtype=torch.bfloat16)


def test_reference_rotations_are_per_head():
    """Sanity of the case builder: per-head rotations differ, so head mix-ups would show."""
    case = build_case(_spec(64, 2, 16), [4], 2, torch.Generator().manual_seed(0),
                      prefix_lens=[0])
    rk, _ = rot_heads(case["rot"], 2)
    assert not torch.allclose(rk[0], rk[1])
    _ = ref


def test_extend_dense_part_rule():
    """The dense INT2 part under "auto": CUDA only, long sequences or long chunks."""
    from oscar_kernels.triton import paged_extend as pe
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pe.EXTEND_INT2_DENSE == "auto"
    assert not pe.extend_dense_part(cpu, 10 ** 6, 10 ** 5)
    assert pe.extend_dense_part(cuda, 32768, 1)
    assert not pe.extend_dense_part(cuda, 32767, 512)
    assert pe.extend_dense_part(cuda, 4096, 4096)
    assert not pe.extend_dense_part(cuda, 30000, 4095)
