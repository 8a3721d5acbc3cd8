"""Paged extend (chunked prefill / prefix-cache hit) attention over the mixed cache.

``paged_extend_attention_triton`` computes :func:`oscar_kernels.reference.paged.paged_extend`:
sequence ``b`` appends ``n_b = qo_indptr[b+1] - qo_indptr[b]`` tokens at positions
``[L_b - n_b, L_b)`` and each of its queries (position ``t``) attends causally, reading
position ``p`` in BF16 when ``p < S`` or ``p > t - W`` and INT2 otherwise.

Order, as the format requires (docs/format.md §5 "Extend order"):

1. ``_quantize_append_kernel`` (quantize_append.py) writes the chunk's INT2 pages and BF16
   sink rows and hands the chunk's rotated BF16 rows (``bf16(x @ R)``) to step 2;
2. the attention reads the pre-chunk window ring, the chunk's own rotated rows, the sink
   rows and the INT2 pages;
3. the chunk's rows that end in the recent window go to the ring.

Step 2 runs one of three ways (the launcher reads the page table on the host: one
synchronization per call):

* **dense** (:mod:`.extend_dense`, :func:`extend_dense_part`: CUDA, long sequences or long
  chunks): the keys of each query split into the old keys ``p <= t - W`` (sink rows and
  dequantized INT2 rows in one fp16 workspace; torch's cuDNN attention with a bottom-right
  causal mask built from two calls) and the BF16 window ``t - W < p <= t`` (torch's
  variable-length flash attention with a sliding window, one call for the batch), merged
  by their log-sum-exp and un-rotated in two small kernels. 1.09x the time of a cuDNN
  BF16 prefill at 124K cached tokens, 1.38x at 28K (4096-token chunks,
  perf/results/2026-12-04_h200_bench_prefill.md);
* **INT2 part + main kernel**: ``_extend_int2_kernel`` attends the INT2 pages in
  64-row x 128-key tiles with fp16 dots only (the query rotated and scaled once by torch
  in fp32; with one scale/zero group per token the four code quarters are joined into one
  ``[N, D]`` operand, so QK is one dot over ``D`` channels and PV one dot of ``D``
  columns, ``_int2_block_whole``) and stores an unnormalized partial ``(m, l, o)`` per
  (token, query head); ``_paged_extend_kernel`` runs the BF16 loops with the same rotated
  query (32 rows) and merges it (``INT2_PART``). Taken when the grid has at least one
  program per SM (:func:`extend_int2_part`); costs two float32 ``[nnz, Hq, D]``
  temporaries (128 MiB each for an 8192-token chunk of 32 heads x 128);
* **one kernel**: ``_paged_extend_kernel`` with all four key loops (short chunks).

``_paged_extend_kernel``, grid ``(cdiv(max n_b, BLOCK_Q), num_kv_heads, batch_size)``: one
program owns ``BLOCK_Q`` consecutive queries of one sequence and all ``GQA`` query heads
of one KV head, flattened into ``BLOCK_M = BLOCK_Q · GP`` rows (``GP = next_pow2(GQA)``).
It rotates its queries (``q @ R_K``), runs four key loops — sink rows, the old ring
(``p > t - W``), the chunk's own rows (``p <= t`` and BF16 by the rule), INT2 pages
(``S <= p <= t - W``) — with per-(query, key) masks, and un-rotates once
(``o' @ R_V^T``, IEEE fp32) before storing.

Constraints: as decode (``head_dim`` in {64, 128, 256}, ``group_size`` in {D, D/2, D/4}).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import expect
from ..spec import CacheSpec, seq_lens_from_page_table
from ._blocks import (_bf16_block, _int2_block, _int2_block_whole, _int2_query, _int2_scale,
                      _int2_unscale, _join4, _rotate_quarter, _split4)
from ._common import interpret_mode, num_sms, page_strides
from .extend_dense import (extend_attention_dense, ring_row_indices, rotate_queries,
                           window_row_indices, write_ring_rows)
from .quantize_append import DEFAULT_SM_COUNT, quantize_append_paged_kv_cache_triton

LOG2E = 1.4426950408889634
# Launch configuration (the launcher's comment says why 16 rows); module constants so that
# perf/tools/extend_probe.py can try others.
EXTEND_BLOCK_M = 16
EXTEND_BLOCK_N = 64
EXTEND_WARPS = 4
EXTEND_STAGES = 1
EXTEND_UNPACK = 2
# The INT2 pages in _extend_int2_kernel first (EXTEND_INT2_BLOCK_M rows per program, fp16
# dots only) when its grid has at least EXTEND_INT2_MIN_PROGRAMS_PER_SM programs per SM
# (long chunks; a short chunk keeps the 16-row programs, 4x as many). On an H200
# (qwen3-8b, one sequence, 4096-token chunk, perf/tools/extend_probe.py; FlashInfer BF16
# prefill 1.28 / 5.80 / 24.1 ms at prefix 4K / 28K / 124K): one kernel 8.25 / 33.6 / 135.7
# ms; 64 x 64 tiles with an element-wise unpack 5.1 / 17.0 / 64.6 ms; the subnormal unpack
# and the main kernel at 32 rows 4.5 / 15.3 / 59.8; whole-row dots (EXTEND_INT2_WHOLE) at
# 64 x 64 4.5 / 15.0 / 56.4 and at 64 x 128 3.44-3.63 / 9.97-10.17 / 35.9-36.2 ms (239-241
# TFLOP/s at 124K); 256-key blocks, 8 warps, 128 rows or 3 stages were slower
# (perf/results/2026-12-02_h200_s25_extend_probe_{1,2,4,5}.txt).
EXTEND_INT2_MIN_PROGRAMS_PER_SM = 1
EXTEND_INT2_BLOCK_M = 64
EXTEND_INT2_BLOCK_N = 128
EXTEND_INT2_WARPS = 4
EXTEND_INT2_STAGES = 2
EXTEND_INT2_UNPACK = 2
EXTEND_INT2_WHOLE = True          # whole-row dots when there is one group per token
# The INT2 part as dequantize + dense attention (extend_dense.py) instead of
# _extend_int2_kernel: "auto" (the rule in extend_dense_part), True or False.
EXTEND_INT2_DENSE = "auto"
# The main kernel when the INT2 part ran first (q arrives rotated, no fp16 dots left in it)
EXTEND_PART_BLOCK_M = 32
EXTEND_PART_BLOCK_N = 64
EXTEND_PART_WARPS = 4
EXTEND_PART_STAGES = 2


@triton.jit
def _program_block(qo_indptr, BLOCK_Q: tl.constexpr):
    """A program's KV head, sequence, the sequence's first chunk row and chunk length, and
    the first query of its block (grid ``(query blocks, KV heads, sequences)``)."""
    h = tl.program_id(1)
    b = tl.program_id(2)
    qo0 = tl.load(qo_indptr + b)
    n_b = tl.load(qo_indptr + b + 1) - qo0
    return h, b, qo0, n_b, tl.program_id(0) * BLOCK_Q


@triton.jit
def _query_block(qo0, n_b, q_start, b, kv_indptr, kv_last, PAGE_SIZE: tl.constexpr,
                 GQA: tl.constexpr, GP: tl.constexpr, BLOCK_Q: tl.constexpr):
    """Geometry of a program's ``BLOCK_Q`` queries x ``GP`` heads (``BLOCK_M`` rows): the
    sequence's first page entry and prefix, each row's query index, head-in-group, position
    ``t``, validity and global token row, and the block's first / last position."""
    BLOCK_M: tl.constexpr = BLOCK_Q * GP
    first = tl.load(kv_indptr + b)
    npages = tl.load(kv_indptr + b + 1) - first
    seq_len = tl.where(npages > 0, (npages - 1) * PAGE_SIZE + tl.load(kv_last + b), 0)
    prefix = seq_len - n_b
    mrow = tl.arange(0, BLOCK_M)
    qidx = q_start + mrow // GP
    r = mrow % GP
    rvalid = (qidx < n_b) & (r < GQA)
    t = prefix + qidx                                                   # [BLOCK_M]
    t_min = prefix + q_start
    t_max = prefix + tl.minimum(q_start + BLOCK_Q, n_b) - 1
    qrow = (qo0 + qidx).to(tl.int64)
    return first, prefix, r, rvalid, t, t_min, t_max, qrow


@triton.jit
def _rotated_query(qr_ptr, stride_qn, stride_qh, qrow, heads, rvalid, PD: tl.constexpr):
    """The quarters ``[BLOCK_M, PD]`` of a query already rotated and scaled (fp32, torch)."""
    j = tl.arange(0, PD)
    qp = qr_ptr + qrow[:, None] * stride_qn + heads[:, None] * stride_qh + j[None, :]
    q0 = tl.load(qp, mask=rvalid[:, None], other=0.0)
    q1 = tl.load(qp + PD, mask=rvalid[:, None], other=0.0)
    q2 = tl.load(qp + 2 * PD, mask=rvalid[:, None], other=0.0)
    q3 = tl.load(qp + 3 * PD, mask=rvalid[:, None], other=0.0)
    return q0, q1, q2, q3


@triton.jit
def _int2_rows(p0, int2_hi, t, rvalid, first, kv_indices, h, sc_page, sc_slot, sc_head,
               sp_page, sp_slot, sp_head, PAGE_SIZE: tl.constexpr, RECENT: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """The INT2 key block at positions ``[p0, p0 + BLOCK_N)`` (below ``int2_hi``): loadable
    tokens, visible (row, token) pairs (``p <= t - W``) and each token's code / param row
    offsets (one page-table load per token)."""
    pos = p0 + tl.arange(0, BLOCK_N)
    ok = pos < int2_hi
    valid = rvalid[:, None] & ok[None, :] & (pos[None, :] <= t[:, None] - RECENT)
    page = tl.load(kv_indices + first + pos // PAGE_SIZE, mask=ok, other=0).to(tl.int64)
    slot = (pos % PAGE_SIZE).to(tl.int64)
    cbase = page * sc_page + slot * sc_slot + h * sc_head
    pbase = page * sp_page + slot * sp_slot + h * sp_head
    return ok, valid, cbase, pbase


@triton.jit
def _paged_extend_kernel(
    q_ptr, stride_qn, stride_qh,                       # q [nnz, Hq, D]
    rot_k_ptr, rot_v_ptr, stride_rh, stride_rd,        # [H, D, D] fp32 (same strides)
    k_new, v_new, stride_nn, stride_nh,                # chunk rows, rotated [nnz, H, D] bf16
    k_codes, v_codes, sc_page, sc_slot, sc_head,
    k_params, v_params, sp_page, sp_slot, sp_head,
    k_win, v_win, sw_slot, sw_row, sw_head,
    qo_indptr, kv_indptr, kv_indices, kv_last, wslots,
    o_ptr, stride_on, stride_oh, lse_ptr, stride_ln,   # out [nnz, Hq, D], lse [nnz, Hq]
    qk_scale,
    PAGE_SIZE: tl.constexpr, SINK: tl.constexpr, RECENT: tl.constexpr,
    D: tl.constexpr, GQA: tl.constexpr, GP: tl.constexpr, NG: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, DOT16: tl.constexpr, UNPACK: tl.constexpr,
    part_o, part_ml, part_sn, INT2_PART: tl.constexpr,
):
    h, b, qo0, n_b, q_start = _program_block(qo_indptr, BLOCK_Q)
    PD: tl.constexpr = D // 4
    BLOCK_M: tl.constexpr = BLOCK_Q * GP
    if q_start < n_b:
        first, prefix, r, rvalid, t, t_min, t_max, qrow = _query_block(
            qo0, n_b, q_start, b, kv_indptr, kv_last, PAGE_SIZE, GQA, GP, BLOCK_Q)
        dd = tl.arange(0, D)
        if INT2_PART:
            # q arrives rotated and scaled (fp32, torch; the INT2 part kernel took it too)
            q0, q1, q2, q3 = _rotated_query(q_ptr, stride_qn, stride_qh, qrow, h * GQA + r,
                                            rvalid, PD)
        else:
            qrows = q_ptr + qrow * stride_qn + (h * GQA + r) * stride_qh      # [BLOCK_M]
            rb = rot_k_ptr + h * stride_rh
            q0 = _rotate_quarter(qrows, rvalid, rb, stride_rd, 1, 0, D, PD, "tf32x3") * qk_scale
            q1 = _rotate_quarter(qrows, rvalid, rb, stride_rd, 1, 1, D, PD, "tf32x3") * qk_scale
            q2 = _rotate_quarter(qrows, rvalid, rb, stride_rd, 1, 2, D, PD, "tf32x3") * qk_scale
            q3 = _rotate_quarter(qrows, rvalid, rb, stride_rd, 1, 3, D, PD, "tf32x3") * qk_scale

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        a0 = tl.zeros([BLOCK_M, PD], tl.float32)
        a1 = tl.zeros([BLOCK_M, PD], tl.float32)
        a2 = tl.zeros([BLOCK_M, PD], tl.float32)
        a3 = tl.zeros([BLOCK_M, PD], tl.float32)
        z0 = tl.zeros([BLOCK_M], tl.float32)
        z1 = tl.zeros([BLOCK_M], tl.float32)
        z2 = tl.zeros([BLOCK_M], tl.float32)
        z3 = tl.zeros([BLOCK_M], tl.float32)
        wbase = tl.load(wslots + b).to(tl.int64) * sw_slot + h * sw_head

        # 1. sink rows written before this chunk: p < min(S, prefix), all visible
        sink_hi = tl.minimum(prefix, SINK)
        for p0 in range(0, sink_hi, BLOCK_N):
            pos = p0 + tl.arange(0, BLOCK_N)
            ok = pos < sink_hi
            valid = ok[None, :] & (pos[None, :] <= t[:, None])
            m_i, l_i, a0, a1, a2, a3 = _bf16_block(
                q0, q1, q2, q3, k_win, v_win, wbase + pos.to(tl.int64) * sw_row, ok, valid,
                m_i, l_i, a0, a1, a2, a3, PD, DOT16)
        # 2. the ring as it was before the chunk: S <= p < prefix with p > t - W
        if RECENT > 0:
            ring_lo = tl.maximum(SINK, t_min - RECENT + 1)
            for p0 in range(ring_lo, prefix, BLOCK_N):
                pos = p0 + tl.arange(0, BLOCK_N)
                ok = pos < prefix
                valid = ok[None, :] & (pos[None, :] > t[:, None] - RECENT)
                rows = (SINK + pos % RECENT).to(tl.int64)
                m_i, l_i, a0, a1, a2, a3 = _bf16_block(
                    q0, q1, q2, q3, k_win, v_win, wbase + rows * sw_row, ok, valid,
                    m_i, l_i, a0, a1, a2, a3, PD, DOT16)
        # 3. the chunk's own rotated rows: prefix <= p <= t, BF16 by the rule: its sink rows
        #    (p < S), then its window rows (p >= S, p > t - W)
        own_sink_hi = tl.minimum(SINK, t_max + 1)
        for p0 in range(prefix, own_sink_hi, BLOCK_N):
            pos = p0 + tl.arange(0, BLOCK_N)
            ok = pos < own_sink_hi
            valid = ok[None, :] & (pos[None, :] <= t[:, None])
            nb = (qo0 + pos - prefix).to(tl.int64) * stride_nn + h * stride_nh
            m_i, l_i, a0, a1, a2, a3 = _bf16_block(
                q0, q1, q2, q3, k_new, v_new, nb, ok, valid,
                m_i, l_i, a0, a1, a2, a3, PD, DOT16)
        own_lo = tl.maximum(tl.maximum(prefix, SINK), t_min - RECENT + 1)
        for p0 in range(own_lo, t_max + 1, BLOCK_N):
            pos = p0 + tl.arange(0, BLOCK_N)
            ok = pos <= t_max
            valid = (ok[None, :] & (pos[None, :] <= t[:, None])
                     & (pos[None, :] > t[:, None] - RECENT))
            nb = (qo0 + pos - prefix).to(tl.int64) * stride_nn + h * stride_nh
            m_i, l_i, a0, a1, a2, a3 = _bf16_block(
                q0, q1, q2, q3, k_new, v_new, nb, ok, valid,
                m_i, l_i, a0, a1, a2, a3, PD, DOT16)
        # 4. INT2 pages: S <= p <= t - W
        if INT2_PART:
            # _extend_int2_kernel attended them already: merge its (m, l, o) (o unnormalized,
            # in code units with the zero terms added, rotated space; m = -inf: no keys)
            prow = qrow * part_sn + h * GQA + r                 # [nnz, Hq] row index
            pm = part_ml + prow * 2
            m_p = tl.load(pm, mask=rvalid, other=float("-inf"))
            l_p = tl.load(pm + 1, mask=rvalid, other=0.0)
            m_new = tl.maximum(m_i, m_p)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            al = tl.exp2(m_i - m_safe)
            ap = tl.exp2(m_p - m_safe)
            l_i = l_i * al + l_p * ap
            m_i = m_new
            po = part_o + prow[:, None] * D + tl.arange(0, PD)[None, :]
            a0 = a0 * al[:, None] + tl.load(po, mask=rvalid[:, None], other=0.0) * ap[:, None]
            a1 = a1 * al[:, None] + tl.load(po + PD, mask=rvalid[:, None], other=0.0) * ap[:, None]
            a2 = (a2 * al[:, None]
                  + tl.load(po + 2 * PD, mask=rvalid[:, None], other=0.0) * ap[:, None])
            a3 = (a3 * al[:, None]
                  + tl.load(po + 3 * PD, mask=rvalid[:, None], other=0.0) * ap[:, None])
        else:
            qc0, qc1, qc2, qc3, qs0, qs1, qs2, qs3 = _int2_query(q0, q1, q2, q3, DOT16, UNPACK)
            a0, a1, a2, a3 = _int2_scale(a0, a1, a2, a3, UNPACK)
            int2_hi = t_max - RECENT + 1
            for p0 in range(SINK, int2_hi, BLOCK_N):
                ok, valid, cbase, pbase = _int2_rows(
                    p0, int2_hi, t, rvalid, first, kv_indices, h, sc_page, sc_slot, sc_head,
                    sp_page, sp_slot, sp_head, PAGE_SIZE, RECENT, BLOCK_N)
                m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3 = _int2_block(
                    qc0, qc1, qc2, qc3, qs0, qs1, qs2, qs3,
                    k_codes, v_codes, cbase, k_params, v_params, pbase, ok, valid,
                    m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3, PD, NG, DOT16, UNPACK)
            a0, a1, a2, a3 = _int2_unscale(a0, a1, a2, a3, UNPACK)

        nonempty = l_i > 0
        inv = tl.where(nonempty, 1.0 / tl.where(nonempty, l_i, 1.0), 0.0)
        lse = tl.where(nonempty, (m_i + tl.log2(tl.where(nonempty, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        o0 = (a0 + z0[:, None]) * inv[:, None]
        o1 = (a1 + z1[:, None]) * inv[:, None]
        o2 = (a2 + z2[:, None]) * inv[:, None]
        o3 = (a3 + z3[:, None]) * inv[:, None]
        # un-rotate once: o = o' @ R_V^T, quarter by quarter: rows [i·PD, (i+1)·PD) of R_V^T
        vb = rot_v_ptr + h * stride_rh
        k = tl.arange(0, PD)
        rt = vb + dd[None, :] * stride_rd + k[:, None]                       # R_V^T [PD, D]
        out = tl.dot(o0, tl.load(rt), input_precision="ieee")
        out += tl.dot(o1, tl.load(rt + PD), input_precision="ieee")
        out += tl.dot(o2, tl.load(rt + 2 * PD), input_precision="ieee")
        out += tl.dot(o3, tl.load(rt + 3 * PD), input_precision="ieee")
        heads = h * GQA + r
        tl.store(o_ptr + qrow[:, None] * stride_on + heads[:, None] * stride_oh + dd[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=rvalid[:, None])
        tl.store(lse_ptr + qrow * stride_ln + heads, lse, mask=rvalid)


@triton.jit
def _extend_int2_kernel(
    qr_ptr, stride_qn, stride_qh,                      # rotated, scaled q [nnz, Hq, D] fp32
    k_codes, v_codes, sc_page, sc_slot, sc_head,
    k_params, v_params, sp_page, sp_slot, sp_head,
    qo_indptr, kv_indptr, kv_indices, kv_last,
    part_o, part_ml, part_sn,                          # [nnz, Hq, D], [nnz, Hq, 2] fp32
    PAGE_SIZE: tl.constexpr, SINK: tl.constexpr, RECENT: tl.constexpr,
    D: tl.constexpr, GQA: tl.constexpr, GP: tl.constexpr, NG: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, DOT16: tl.constexpr, UNPACK: tl.constexpr,
    WHOLE: tl.constexpr,
):
    """The INT2 pages of an extend (``S <= p <= t - W``) for ``BLOCK_Q`` queries x ``GP``
    heads of one KV head, with wide row tiles (64 rows: the tensor cores' wgmma path), fp16
    operands only and, with ``WHOLE`` (one scale/zero group per token), whole-row dots over
    the joined code quarters (``_int2_block_whole``; quarter dots otherwise); stores the
    unnormalized partial ``(m, l, o)`` that ``_paged_extend_kernel`` merges with the BF16
    rows (``INT2_PART``)."""
    h, b, qo0, n_b, q_start = _program_block(qo_indptr, BLOCK_Q)
    PD: tl.constexpr = D // 4
    BLOCK_M: tl.constexpr = BLOCK_Q * GP
    if q_start < n_b:
        first, prefix, r, rvalid, t, t_min, t_max, qrow = _query_block(
            qo0, n_b, q_start, b, kv_indptr, kv_last, PAGE_SIZE, GQA, GP, BLOCK_Q)
        q0, q1, q2, q3 = _rotated_query(qr_ptr, stride_qn, stride_qh, qrow, h * GQA + r,
                                        rvalid, PD)
        q0, q1, q2, q3, qs0, qs1, qs2, qs3 = _int2_query(q0, q1, q2, q3, DOT16, UNPACK)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        int2_hi = t_max - RECENT + 1
        if WHOLE:
            # one scale/zero group per token: whole-row dots over the joined quarters
            tl.static_assert(NG == 1, "whole-row dots need one group per token")
            qj = _join4(q0, q1, q2, q3)
            qsum = qs0 + qs1 + qs2 + qs3
            acc = tl.zeros([BLOCK_M, 4 * PD], tl.float32)
            z = tl.zeros([BLOCK_M], tl.float32)
            for p0 in range(SINK, int2_hi, BLOCK_N):
                ok, valid, cbase, pbase = _int2_rows(
                    p0, int2_hi, t, rvalid, first, kv_indices, h, sc_page, sc_slot, sc_head,
                    sp_page, sp_slot, sp_head, PAGE_SIZE, RECENT, BLOCK_N)
                m_i, l_i, acc, z = _int2_block_whole(
                    qj, qsum, acc, z, k_codes, v_codes, cbase, k_params, v_params, pbase, ok,
                    valid, m_i, l_i, PD, DOT16, UNPACK)
            a0, a1, a2, a3 = _split4(acc, PD)
            z0 = z
            z1 = z
            z2 = z
            z3 = z
        else:
            a0 = tl.zeros([BLOCK_M, PD], tl.float32)
            a1 = tl.zeros([BLOCK_M, PD], tl.float32)
            a2 = tl.zeros([BLOCK_M, PD], tl.float32)
            a3 = tl.zeros([BLOCK_M, PD], tl.float32)
            z0 = tl.zeros([BLOCK_M], tl.float32)
            z1 = tl.zeros([BLOCK_M], tl.float32)
            z2 = tl.zeros([BLOCK_M], tl.float32)
            z3 = tl.zeros([BLOCK_M], tl.float32)
            for p0 in range(SINK, int2_hi, BLOCK_N):
                ok, valid, cbase, pbase = _int2_rows(
                    p0, int2_hi, t, rvalid, first, kv_indices, h, sc_page, sc_slot, sc_head,
                    sp_page, sp_slot, sp_head, PAGE_SIZE, RECENT, BLOCK_N)
                m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3 = _int2_block(
                    q0, q1, q2, q3, qs0, qs1, qs2, qs3,
                    k_codes, v_codes, cbase, k_params, v_params, pbase, ok, valid,
                    m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3, PD, NG, DOT16, UNPACK)
        a0, a1, a2, a3 = _int2_unscale(a0, a1, a2, a3, UNPACK)
        j = tl.arange(0, PD)
        prow = qrow * part_sn + h * GQA + r
        po = part_o + prow[:, None] * D + j[None, :]
        smask = rvalid[:, None]
        tl.store(po, a0 + z0[:, None], mask=smask)
        tl.store(po + PD, a1 + z1[:, None], mask=smask)
        tl.store(po + 2 * PD, a2 + z2[:, None], mask=smask)
        tl.store(po + 3 * PD, a3 + z3[:, None], mask=smask)
        tl.store(part_ml + prow * 2, m_i, mask=rvalid)
        tl.store(part_ml + prow * 2 + 1, l_i, mask=rvalid)


def extend_int2_part(max_chunk: int, num_kv_heads: int, batch_size: int, gqa: int,
                     device: torch.device) -> bool:
    """Whether an extend attends its INT2 pages in :func:`_extend_int2_kernel` first: when
    that kernel's grid (``EXTEND_INT2_BLOCK_M`` rows = ``BLOCK_M / next_pow2(gqa)`` queries
    per program) has at least ``EXTEND_INT2_MIN_PROGRAMS_PER_SM`` programs per SM."""
    bq = max(1, EXTEND_INT2_BLOCK_M // triton.next_power_of_2(gqa))
    return (triton.cdiv(max_chunk, bq) * num_kv_heads * batch_size
            >= EXTEND_INT2_MIN_PROGRAMS_PER_SM * num_sms(device, DEFAULT_SM_COUNT))


#: Under "auto" the extend runs as dense library attention (extend_dense.py) on CUDA when the
#: longest sequence has at least EXTEND_DENSE_MIN_TOKENS tokens or the longest chunk at least
#: EXTEND_DENSE_MIN_CHUNK. Measured on an H200 (Qwen3-8B geometry, batch 1,
#: perf/bench_prefill.py --int2-paths dense,kernel; dense vs the Triton kernels): chunk 512 on
#: 0 / 4K / 28K / 60K / 124K cached tokens 1.58 / 1.66 / 1.65 / 1.60 / 2.33 vs 0.97 / 0.92 /
#: 1.48 / 2.63 / 4.90 ms; chunk 4096 on 0 / 4K / 28K 1.60 / 2.01 / 4.23 vs 2.24 / 3.33 /
#: 9.87 ms; batch 8 x 1024 on 32K 9.56 vs 20.6 ms (perf/results/*_h200_bench_prefill.md).
EXTEND_DENSE_MIN_TOKENS = 32768
EXTEND_DENSE_MIN_CHUNK = 4096


def extend_dense_part(device: torch.device, max_seq_len: int, max_chunk: int) -> bool:
    """Whether the extend runs as dense library attention (:mod:`.extend_dense`):
    ``EXTEND_INT2_DENSE``, or under ``"auto"`` on CUDA devices (torch's cuDNN and flash
    attention; the interpreter runs the Triton kernels) for long sequences or long chunks
    (the thresholds above)."""
    if EXTEND_INT2_DENSE != "auto":
        return bool(EXTEND_INT2_DENSE)
    return device.type == "cuda" and (max_seq_len >= EXTEND_DENSE_MIN_TOKENS
                                      or max_chunk >= EXTEND_DENSE_MIN_CHUNK)


@dataclass(frozen=True)
class ExtendPlan:
    """The host-side geometry of one extend batch, shared by every layer of a forward pass
    (the page table and the chunks are the same in each): the page table on the host, each
    new token's sequence and position, which path runs, and for the dense path the index
    tensors of the window rows and of the ring writes. Made by :func:`plan_extend`."""

    spec: CacheSpec
    nnz: int
    batch_size: int
    seq_lens: list
    qo: list
    kv_indptr: list
    window_slots: list
    max_chunk: int
    max_seq_len: int
    batch_indices: torch.Tensor
    positions: torch.Tensor
    dense: bool
    cu_k: list | None = None
    cu_dev: tuple | None = None
    window_idx: list | None = None
    ring_idx: list | None = None


def plan_extend(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                kv_last_page_len: torch.Tensor, window_slots: torch.Tensor,
                spec: CacheSpec) -> ExtendPlan:
    """Plan an extend batch once (one host read of the page table, one copy of the index
    tensors to the device); pass the plan to every layer's extend call."""
    dev = qo_indptr.device
    batch_size = qo_indptr.shape[0] - 1
    seq_lens = seq_lens_from_page_table(kv_indptr, kv_last_page_len, spec.page_size)
    qo = qo_indptr.long()
    chunk = qo[1:] - qo[:-1]
    nb = batch_size
    host = torch.cat([seq_lens.long(), qo, kv_indptr.long(), window_slots.long()]).tolist()
    lens_h, qo_h, indptr_h, slots_h = (host[:nb], host[nb:2 * nb + 1],
                                       host[2 * nb + 1:3 * nb + 2], host[3 * nb + 2:])
    nnz = qo_h[-1]
    batch_indices = torch.repeat_interleave(torch.arange(batch_size, device=dev), chunk,
                                            output_size=nnz)
    positions = (torch.arange(nnz, device=dev) - qo[batch_indices]
                 + (seq_lens - chunk)[batch_indices])
    max_chunk = max((b - a for a, b in zip(qo_h, qo_h[1:])), default=0)
    max_seq_len = max(lens_h, default=0)
    dense = extend_dense_part(dev, max_seq_len, max_chunk)
    extra = {}
    if dense:
        cu_k, widx = window_row_indices(spec, slots_h, lens_h, qo_h)
        ridx = ring_row_indices(spec, slots_h, lens_h, qo_h)
        parts = widx + ridx + [torch.tensor(qo_h), torch.tensor(cu_k)]
        sizes = [t.numel() for t in parts]
        flat = torch.cat(parts).to(dev).split(sizes)                 # one copy
        extra = dict(cu_k=cu_k, window_idx=list(flat[:5]), ring_idx=list(flat[5:8]),
                     cu_dev=(flat[8].to(torch.int32), flat[9].to(torch.int32)))
    return ExtendPlan(spec, nnz, batch_size, lens_h, qo_h, indptr_h, slots_h, max_chunk,
                      max_seq_len, batch_indices.to(torch.int32), positions.to(torch.int32),
                      dense, **extra)


def paged_extend_attention_triton(q: torch.Tensor, append_key: torch.Tensor,
                                  append_value: torch.Tensor, qo_indptr: torch.Tensor, cache,
                                  kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                                  kv_last_page_len: torch.Tensor, window_slots: torch.Tensor,
                                  rot_k: torch.Tensor, rot_v: torch.Tensor, k_clip: float,
                                  v_clip: float, sm_scale: float, *,
                                  out: torch.Tensor | None = None,
                                  plan: ExtendPlan | None = None
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Append a chunk per sequence and attend with its queries (cache updated in place).

    Parameters
    ----------
    q : Tensor ``[nnz, num_qo_heads, head_dim]``, model space.
    append_key, append_value : Tensor ``[nnz, num_kv_heads, head_dim]``, model space.
    qo_indptr : Tensor ``[batch_size + 1]`` int32, chunk offsets (``qo_indptr[-1] == nnz``).
    cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v
        As in :func:`~oscar_kernels.triton.paged_decode.paged_decode_attention_triton`;
        the page table already covers the chunk.
    k_clip, v_clip, sm_scale : float
    out : Tensor, optional ``[nnz, num_qo_heads, head_dim]`` of ``q.dtype``.
    plan : ExtendPlan, optional
        :func:`plan_extend` of this batch, shared by every layer (otherwise each call plans,
        which reads the page table on the host: one synchronization).

    Returns
    -------
    ``o [nnz, num_qo_heads, head_dim]`` (``q.dtype``, model space), ``lse [nnz, num_qo_heads]``.

    Example
    -------
    >>> # see tests/triton/test_triton_interp.py (CPU, TRITON_INTERPRET=1)
    """
    spec = cache.spec
    nnz, num_qo_heads, d = q.shape
    h = spec.num_kv_heads
    gqa = num_qo_heads // h
    batch_size = qo_indptr.shape[0] - 1
    result = out
    if out is None or out.stride(-1) != 1:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((nnz, num_qo_heads), dtype=torch.float32, device=q.device)
    if nnz == 0:
        return (result if result is not None else out), lse
    q = q if q.stride(-1) == 1 else q.contiguous()
    rot_k = rot_k.to(torch.float32)
    rot_v = rot_v.to(torch.float32)
    if rot_k.stride()[1:] != (d, 1) or rot_v.stride() != rot_k.stride():
        rot_k, rot_v = rot_k.contiguous(), rot_v.contiguous()

    if plan is None:
        plan = plan_extend(qo_indptr, kv_indptr, kv_last_page_len, window_slots, spec)
    expect(plan.nnz == nnz and plan.batch_size == batch_size and plan.spec == spec, "plan",
           f"a plan of this batch (nnz={nnz}, batch_size={batch_size}, the cache's spec)",
           plan)
    table = (kv_indices, kv_indptr, kv_last_page_len, window_slots, rot_k, rot_v, k_clip, v_clip)
    # the chunk's pages and sink rows, and its rotated rows bf16(x @ R) for the attention
    k_new = torch.empty(append_key.shape, dtype=torch.bfloat16, device=q.device)
    v_new = torch.empty_like(k_new)
    quantize_append_paged_kv_cache_triton(cache, append_key, append_value, plan.batch_indices,
                                          plan.positions, *table, write_pages=True,
                                          write_recent=False, rows_out=(k_new, v_new))
    max_chunk, max_seq_len = plan.max_chunk, plan.max_seq_len
    batch_indices, positions = plan.batch_indices, plan.positions
    gp = triton.next_power_of_2(gqa)
    interp = interpret_mode(q.device)
    # 16 query rows and 4 warps: the MMAv2 (mma.sync) path the decode kernel runs. With 64
    # rows Triton picks wgmma for these fp16/TF32 operand mixes and the kernel read out of
    # bounds or returned wrong values on the H200 (tests/triton, 2026-11-29).
    block_m = EXTEND_BLOCK_M
    block_q = max(1, block_m // gp)
    block_n = 32 if interp else EXTEND_BLOCK_N
    sc = page_strides(cache.k_codes, spec.kv_layout)
    sp = page_strides(cache.k_params, spec.kv_layout)
    sw = cache.k_window.stride()
    bq = max(1, (16 if interp else EXTEND_INT2_BLOCK_M) // gp)
    if plan.dense:
        # every key set as library dense attention (extend_dense.py)
        qh = rotate_queries(q, rot_k)
        extend_attention_dense(qh, k_new, v_new, cache, kv_indices, plan, rot_v, sm_scale,
                               out, lse)
        write_ring_rows(cache, k_new, v_new, plan.ring_idx)
        if result is not None and result.data_ptr() != out.data_ptr():
            result.copy_(out)
            out = result
        return out, lse
    int2_part = extend_int2_part(max_chunk, h, batch_size, gqa, q.device)
    if int2_part:
        # the INT2 pages first, in wide row tiles: q rotated and scaled once (fp32, torch),
        # the partial (m, l, o) per (token, query head) merged by the kernel below
        qr = torch.einsum("nhgd,hde->nhge", q.to(torch.float32).reshape(nnz, h, gqa, d),
                          rot_k).reshape(nnz, num_qo_heads, d) * (float(sm_scale) * LOG2E)
        part_o = torch.empty((nnz, num_qo_heads, d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((nnz, num_qo_heads, 2), dtype=torch.float32, device=q.device)
        _extend_int2_kernel[(triton.cdiv(max_chunk, bq), h, batch_size)](
            qr, qr.stride(0), qr.stride(1),
            cache.k_codes, cache.v_codes, *sc, cache.k_params, cache.v_params, *sp,
            qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
            part_o, part_ml, num_qo_heads,
            PAGE_SIZE=spec.page_size, SINK=spec.sink_size, RECENT=spec.recent_size,
            D=d, GQA=gqa, GP=gp, NG=spec.num_groups, BLOCK_Q=bq,
            BLOCK_N=32 if interp else EXTEND_INT2_BLOCK_N, DOT16=not interp,
            UNPACK=EXTEND_INT2_UNPACK, WHOLE=EXTEND_INT2_WHOLE and spec.num_groups == 1,
            num_warps=EXTEND_INT2_WARPS, num_stages=EXTEND_INT2_STAGES,
        )
        # the BF16 rows next, from the same rotated query
        q_in, warps, stages = qr, EXTEND_PART_WARPS, EXTEND_PART_STAGES
        if not interp:
            block_q = max(1, EXTEND_PART_BLOCK_M // gp)
            block_n = EXTEND_PART_BLOCK_N
    else:
        part_o = part_ml = lse            # unused (INT2_PART=False)
        q_in, warps, stages = q, EXTEND_WARPS, EXTEND_STAGES
    grid = (triton.cdiv(max_chunk, block_q), h, batch_size)
    _paged_extend_kernel[grid](
        q_in, q_in.stride(0), q_in.stride(1), rot_k, rot_v, rot_k.stride(0), rot_k.stride(1),
        k_new, v_new, k_new.stride(0), k_new.stride(1),
        cache.k_codes, cache.v_codes, *sc, cache.k_params, cache.v_params, *sp,
        cache.k_window, cache.v_window, sw[0], sw[1], sw[2],
        qo_indptr, kv_indptr, kv_indices, kv_last_page_len, window_slots,
        out, out.stride(0), out.stride(1), lse, lse.stride(0),
        float(sm_scale) * LOG2E,
        PAGE_SIZE=spec.page_size, SINK=spec.sink_size, RECENT=spec.recent_size,
        D=d, GQA=gqa, GP=gp, NG=spec.num_groups, BLOCK_Q=block_q, BLOCK_N=block_n,
        DOT16=not interp, UNPACK=EXTEND_UNPACK,
        part_o=part_o, part_ml=part_ml, part_sn=num_qo_heads, INT2_PART=int2_part,
        num_warps=warps, num_stages=stages,
    )
    quantize_append_paged_kv_cache_triton(cache, append_key, append_value, batch_indices,
                                          positions, *table, write_pages=False,
                                          write_recent=True)
    if result is not None and result.data_ptr() != out.data_ptr():
        result.copy_(out)
        out = result
    return out, lse


__all__ = ["ExtendPlan", "paged_extend_attention_triton", "plan_extend", "extend_int2_part"]
