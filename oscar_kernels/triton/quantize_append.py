"""Fused rotate → clip → quantize → pack → store of new K/V rows (one Triton kernel).

``quantize_append_paged_kv_cache_triton`` writes ``nnz`` new tokens of one layer into the
INT2 pages and the BF16 windows of an :class:`~oscar_kernels.cache.Int2PagedKVCache`,
exactly as :func:`oscar_kernels.reference.paged.append_paged_kv` (docs/format.md §2–5).

Kernel ``_quantize_append_kernel``, grid ``(cdiv(nnz, BLOCK_T), num_kv_heads, 2)``: one
program takes ``BLOCK_T`` tokens of one KV head, axis 2 picks K (0) or V (1). Per program:

1. ``x [BLOCK_T, D]`` (any float dtype, upcast to float32) times ``R [D, D]`` float32 with
   an IEEE fp32 ``tl.dot`` (not TF32): ``x' = x @ R``. Only the summation order differs
   from the reference's einsum, so a code can differ from the reference where
   ``(x'c - zero) / scale + 0.5`` lands within an ulp of an integer (a rounding tie):
   the tests allow at most 1e-3 of the codes to differ, each by one level.
2. Per group of ``G`` channels (``x'`` reshaped ``[BLOCK_T, D/G, G]``): non-finite guard,
   clip threshold = element of rank ``k`` of ``sort(|x'|)`` (``tl.sort`` on the GPU; the
   equivalent rank count ``min{a_e : #{a_j <= a_e} > k}`` in the interpreter, where
   ``tl.sort`` is slow), clamp,
   ``scale = store((max - min) / 3)``, ``zero = store(min)`` (fp16 saturating or fp32),
   ``code = clamp(floor((x'c - zero) / scale + 0.5), 0, 3)`` with IEEE division
   (``div_rn``) against the stored values; ``scale == 0`` → codes 0.
3. Pack ``byte j = Σ_i code[j + i·D/4] << 2i`` and store codes + (scale, zero) at
   ``(page, slot, head)``; layout (NHD/HND) enters only through the strides.
4. BF16 window rows: sink row ``p`` for ``p < S`` (with ``WRITE_PAGES``), ring row
   ``S + p % W`` for ``p >= max(S, seq_len - W)`` (with ``WRITE_RECENT``).

Constraints: ``head_dim`` a power of two in [16, 256]; ``group_size`` a power of two
dividing it. ``BLOCK_T = 16`` is the smallest row count ``tl.dot`` takes; the rotation
``R`` is read once per 16 tokens (L2-resident across programs), 16 rows at a time. Small
appends (decode steps: one token per sequence) run one token per program instead, the
rotation as a broadcast product and sum (latency of one program, not throughput), as long
as the grid has at most ``TOKEN_PROGRAMS_PER_SM`` programs per SM; up to
``WIDE_TILE_PROGRAMS_PER_SM`` per SM each program takes ``R`` in one tile of up to 128 rows
(all of its loads in flight at once, one cross-warp reduction; 128 registers a thread),
otherwise 16 rows at a time (:func:`append_plan`). Measured on an H200 (
perf/results/2026-12-02_h200_s24_append_probe_*.txt, 8 KV heads, head_dim 128, per-head
rotations, cold L2, CUDA-graph replays): one-token programs with 128-row tiles 8.5 / 9.3 /
10.7 us at 1 / 8 / 16 new tokens (16-row tiles: 11.4 / 12.1 / 12.7); at 32 the 16-row
tiles 14.6 us (128-row 16.6); from ~50 the 16-token tiles (18-19 us, flat in the token
count; one-token programs 19.5 / 24.5 us at 50 / 64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import expect
from ..reference.quant import clip_index
from ._common import interpret_mode, num_sms, page_strides

BLOCK_T = 16
TOKEN_PROGRAMS_PER_SM = 6       # one token per program up to this many programs per SM
WIDE_TILE_PROGRAMS_PER_SM = 2   # ... and R in one tile of up to 128 rows up to this many
DEFAULT_SM_COUNT = 132          # off the GPU (the interpreter): an H100 / H200's SM count


@triton.jit
def _to_bf16_rtne(x):
    """float32 → bfloat16, round to nearest even, in integer arithmetic: the interpreter's
    cast truncates, the GPU's rounds; this is exact on both (NaN and Inf stay)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x).to(tl.bfloat16)


@triton.jit
def _quantize_append_kernel(
    k_ptr, v_ptr, stride_xn, stride_xh,              # append K/V [nnz, H, D] (same strides)
    rot_k_ptr, rot_v_ptr, stride_rh, stride_rd,      # [H, D, D] float32 (stride_rh may be 0)
    bidx_ptr, pos_ptr, nnz,                          # [nnz] int32
    kv_indices_ptr, kv_indptr_ptr, kv_last_ptr, wslot_ptr,
    k_codes_ptr, v_codes_ptr, sc_page, sc_slot, sc_head,   # codes [.., D/4] uint8
    k_params_ptr, v_params_ptr, sp_page, sp_slot, sp_head,  # params [.., NG, 2]
    k_win_ptr, v_win_ptr, sw_slot, sw_row, sw_head,  # windows [slots, S+W, H, D] bf16
    k_clip_idx, v_clip_idx,
    k_rows_ptr, v_rows_ptr, stride_on, stride_oh,   # rotated rows out [nnz, H, D] bf16
    PAGE_SIZE: tl.constexpr, SINK: tl.constexpr, RECENT: tl.constexpr,
    D: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, FP16_PARAMS: tl.constexpr,
    WRITE_PAGES: tl.constexpr, WRITE_RECENT: tl.constexpr, BLOCK_T: tl.constexpr,
    RANK_BY_SORT: tl.constexpr, KC: tl.constexpr, ROWS_OUT: tl.constexpr,
):
    pid_t = tl.program_id(0)
    h = tl.program_id(1)
    which = tl.program_id(2)                        # 0: K, 1: V
    PD: tl.constexpr = D // 4

    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    rmask = rows < nnz
    d = tl.arange(0, D)
    if which == 0:
        x_base = k_ptr
        r_base = rot_k_ptr
        codes_base = k_codes_ptr
        params_base = k_params_ptr
        win_base = k_win_ptr
        clip_idx = k_clip_idx
        rows_base = k_rows_ptr
    else:
        x_base = v_ptr
        r_base = rot_v_ptr
        codes_base = v_codes_ptr
        params_base = v_params_ptr
        win_base = v_win_ptr
        clip_idx = v_clip_idx
        rows_base = v_rows_ptr

    # x' = x @ R as D/KC IEEE fp32 dots of [BLOCK_T, KC] x [KC, D] (KC = 16): one
    # [BLOCK_T, D] x [D, D] FMA dot made ptxas drop to 32 registers with a 9 KB spill stack
    # (ptxas -v, sm_90a). Below 16 rows (decode: one token per sequence) tl.dot cannot run;
    # the same fp32 products are summed by a broadcast multiply and a reduction over KC
    # rows of R at a time (the launcher's KC: all of R's rows in one tile up to D = 128, so
    # its loads are all in flight at once and there is one cross-warp reduction).
    kc = tl.arange(0, KC)
    xrow = x_base + rows.to(tl.int64) * stride_xn + h * stride_xh                # [BLOCK_T]
    xr = tl.zeros([BLOCK_T, D], tl.float32)
    for c in tl.static_range(D // KC):
        x = tl.load(xrow[:, None] + (c * KC + kc)[None, :], mask=rmask[:, None],
                    other=0.0).to(tl.float32)                                    # [BLOCK_T, 16]
        rot = tl.load(r_base + h * stride_rh + (c * KC + kc)[:, None] * stride_rd + d[None, :])
        if BLOCK_T >= 16:
            xr += tl.dot(x, rot, input_precision="ieee")                         # [BLOCK_T, D]
        else:
            xr += tl.sum(x[:, :, None] * rot[None, :, :], axis=1)

    b = tl.load(bidx_ptr + rows, mask=rmask, other=0)
    p = tl.load(pos_ptr + rows, mask=rmask, other=0)
    first = tl.load(kv_indptr_ptr + b, mask=rmask, other=0)
    npages = tl.load(kv_indptr_ptr + b + 1, mask=rmask, other=0) - first
    last = tl.load(kv_last_ptr + b, mask=rmask, other=0)
    seq_len = tl.where(npages > 0, (npages - 1) * PAGE_SIZE + last, 0)
    wslot = tl.load(wslot_ptr + b, mask=rmask, other=0).to(tl.int64)
    xr_bf16 = _to_bf16_rtne(xr)
    if ROWS_OUT:
        orow = rows.to(tl.int64) * stride_on + h * stride_oh
        tl.store(rows_base + orow[:, None] + d[None, :], xr_bf16, mask=rmask[:, None])

    if WRITE_PAGES:
        page = tl.load(kv_indices_ptr + first + p // PAGE_SIZE, mask=rmask, other=0).to(tl.int64)
        slot = (p % PAGE_SIZE).to(tl.int64)
        xg = tl.reshape(xr, [BLOCK_T, NG, G])
        finite = tl.min((tl.abs(xg) < float("inf")).to(tl.int32), axis=2) > 0   # [BLOCK_T, NG]
        xs = tl.where(finite[:, :, None], xg, 0.0)
        ax = tl.abs(xs)
        if RANK_BY_SORT:
            srt = tl.sort(ax, dim=2)
            ranks = tl.arange(0, G)
            tau = tl.sum(tl.where(ranks[None, None, :] == clip_idx, srt, 0.0), axis=2)
        else:
            # rank counting: tau = min{ a_e : #{j : a_j <= a_e} > clip_idx }
            cnt = tl.sum((ax[:, :, None, :] <= ax[:, :, :, None]).to(tl.int32), axis=3)
            tau = tl.min(tl.where(cnt > clip_idx, ax, float("inf")), axis=2)
        xc = tl.minimum(tl.maximum(xs, -tau[:, :, None]), tau[:, :, None])
        mn = tl.min(xc, axis=2)
        mx = tl.max(xc, axis=2)
        scale = tl.math.div_rn(mx - mn, 3.0)
        if FP16_PARAMS:
            scale_s = tl.minimum(scale, 65504.0).to(tl.float16)
            zero_s = tl.minimum(tl.maximum(mn, -65504.0), 65504.0).to(tl.float16)
        else:
            scale_s = scale
            zero_s = mn
        scale_f = scale_s.to(tl.float32)
        zero_f = zero_s.to(tl.float32)
        pos_scale = scale_f > 0
        safe = tl.where(pos_scale, scale_f, 1.0)
        t = tl.floor(tl.math.div_rn(xc - zero_f[:, :, None], safe[:, :, None]) + 0.5)
        t = tl.minimum(tl.maximum(t, 0.0), 3.0)
        keep = pos_scale & finite
        codes = tl.where(keep[:, :, None], t, 0.0).to(tl.int32)             # [BLOCK_T, NG, G]
        codes = tl.reshape(codes, [BLOCK_T, 4, PD])
        shifts = 2 * tl.arange(0, 4)
        packed = tl.sum(codes << shifts[None, :, None], axis=1)             # [BLOCK_T, PD]
        j = tl.arange(0, PD)
        cbase = page * sc_page + slot * sc_slot + h * sc_head
        tl.store(codes_base + cbase[:, None] + j[None, :], packed.to(tl.uint8),
                 mask=rmask[:, None])
        nan = float("nan")
        sc_out = tl.where(finite, scale_f, nan)
        ze_out = tl.where(finite, zero_f, nan)
        g = tl.arange(0, NG)
        pbase = page * sp_page + slot * sp_slot + h * sp_head
        pptr = params_base + pbase[:, None] + 2 * g[None, :]
        tl.store(pptr, sc_out.to(params_base.dtype.element_ty), mask=rmask[:, None])
        tl.store(pptr + 1, ze_out.to(params_base.dtype.element_ty), mask=rmask[:, None])
        sink = rmask & (p < SINK)
        wrow = wslot * sw_slot + p.to(tl.int64) * sw_row + h * sw_head
        tl.store(win_base + wrow[:, None] + d[None, :], xr_bf16, mask=sink[:, None])
    if WRITE_RECENT:
        if RECENT > 0:
            rec = rmask & (p >= SINK) & (p >= seq_len - RECENT)
            ring = (SINK + p % RECENT).to(tl.int64)
            wrow = wslot * sw_slot + ring * sw_row + h * sw_head
            tl.store(win_base + wrow[:, None] + d[None, :], xr_bf16, mask=rec[:, None])


def token_rot_rows(d: int) -> int:
    """Rows of ``R`` per tile in the wide one-token programs: 128 elements per thread of 4
    warps (all of ``R`` at ``head_dim`` <= 128, a quarter of it at 256)."""
    return max(16, min(d, 16384 // d))


def append_plan(nnz: int, num_kv_heads: int, head_dim: int,
                device: torch.device) -> tuple[int, int]:
    """``(tokens per program, rows of R per rotation tile)`` for an append of ``nnz``
    tokens: one-token programs while the grid (``nnz x heads x 2``) has at most
    ``TOKEN_PROGRAMS_PER_SM`` programs per SM, with R in one wide tile up to
    ``WIDE_TILE_PROGRAMS_PER_SM``; 16-token tiles (``tl.dot``) above."""
    programs = nnz * num_kv_heads * 2
    sms = num_sms(device, DEFAULT_SM_COUNT)
    if programs > TOKEN_PROGRAMS_PER_SM * sms:
        return BLOCK_T, 16
    return 1, token_rot_rows(head_dim) if programs <= WIDE_TILE_PROGRAMS_PER_SM * sms else 16


def quantize_append_paged_kv_cache_triton(cache, append_key: torch.Tensor,
                                          append_value: torch.Tensor,
                                          batch_indices: torch.Tensor, positions: torch.Tensor,
                                          kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                                          kv_last_page_len: torch.Tensor,
                                          window_slots: torch.Tensor, rot_k: torch.Tensor,
                                          rot_v: torch.Tensor, k_clip: float, v_clip: float, *,
                                          write_pages: bool = True,
                                          write_recent: bool = True,
                                          rows_out: tuple[torch.Tensor, torch.Tensor] | None = None
                                          ) -> None:
    """Rotate, clip, quantize, pack and store ``nnz`` new tokens into ``cache`` (in place).

    Parameters
    ----------
    cache : Int2PagedKVCache
        Written in place (pages, params, sink rows, recent-ring rows).
    append_key, append_value : Tensor ``[nnz, num_kv_heads, head_dim]``
        bf16/fp16/fp32, model space; same dtype and strides, last dim contiguous.
    batch_indices, positions : Tensor ``[nnz]`` int32
    kv_indices, kv_indptr, kv_last_page_len, window_slots : Tensor int32
        FlashInfer page table covering the new tokens, and the window slot of each sequence.
    rot_k, rot_v : Tensor ``[num_kv_heads, head_dim, head_dim]`` float32
        Per-head rotations (an ``expand``ed view with stride 0 on the head dim is fine).
    k_clip, v_clip : float
        Clip ratios in (0, 1].
    write_pages, write_recent : bool
        As in :func:`oscar_kernels.reference.paged.append_paged_kv` (extend writes the
        pages and sink first and the recent ring after its attention).
    rows_out : (Tensor, Tensor), optional
        Two bf16 ``[nnz, num_kv_heads, head_dim]`` tensors that receive the rotated rows
        ``bf16(x @ R)`` of K and V (what the windows store), for an extend's attention.

    Example
    -------
    >>> # see tests/triton/test_triton_interp.py (CPU, TRITON_INTERPRET=1)
    """
    spec = cache.spec
    nnz, h, d = append_key.shape
    if nnz == 0:
        return
    append_value = append_value.to(append_key.dtype)
    if append_key.stride() != append_value.stride() or append_key.stride(-1) != 1:
        append_key, append_value = append_key.contiguous(), append_value.contiguous()
    rot_k = rot_k.to(torch.float32)
    rot_v = rot_v.to(torch.float32)
    if rot_k.stride()[1:] != (d, 1) or rot_v.stride() != rot_k.stride():
        rot_k, rot_v = rot_k.contiguous(), rot_v.contiguous()
    sc = page_strides(cache.k_codes, spec.kv_layout)
    sp = page_strides(cache.k_params, spec.kv_layout)
    sw = cache.k_window.stride()
    # one token per program for small appends (a decode step: one token per sequence):
    # 16x less rotation work on the critical path of each program than a 16-row tile
    block_t, kc = append_plan(nnz, h, d, append_key.device)
    rows = rows_out if rows_out is not None else (cache.k_window, cache.v_window)
    if rows_out is not None:
        expect(all(r.shape == (nnz, h, d) and r.dtype == torch.bfloat16 and r.stride(-1) == 1
                   and r.stride() == rows[0].stride() for r in rows_out), "rows_out",
               f"two bf16 [{nnz}, {h}, {d}] tensors with equal strides", rows_out)
    grid = (triton.cdiv(nnz, block_t), h, 2)
    _quantize_append_kernel[grid](
        append_key, append_value, append_key.stride(0), append_key.stride(1),
        rot_k, rot_v, rot_k.stride(0), rot_k.stride(1),
        batch_indices, positions, nnz,
        kv_indices, kv_indptr, kv_last_page_len, window_slots,
        cache.k_codes, cache.v_codes, *sc,
        cache.k_params, cache.v_params, *sp,
        cache.k_window, cache.v_window, sw[0], sw[1], sw[2],
        clip_index(k_clip, spec.group_size), clip_index(v_clip, spec.group_size),
        *rows, rows[0].stride(0), rows[0].stride(1),
        PAGE_SIZE=spec.page_size, SINK=spec.sink_size, RECENT=spec.recent_size,
        D=d, G=spec.group_size, NG=spec.num_groups,
        FP16_PARAMS=spec.scale_dtype == torch.float16,
        WRITE_PAGES=write_pages, WRITE_RECENT=write_recent, BLOCK_T=block_t,
        RANK_BY_SORT=not interpret_mode(append_key.device), KC=kc,
        ROWS_OUT=rows_out is not None, num_warps=8 if block_t > 1 else 4,
    )


__all__ = ["quantize_append_paged_kv_cache_triton", "append_plan", "BLOCK_T",
           "TOKEN_PROGRAMS_PER_SM", "WIDE_TILE_PROGRAMS_PER_SM"]
