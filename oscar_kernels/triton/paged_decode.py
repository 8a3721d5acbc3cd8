"""Split-KV (flash-decoding) paged decode attention over the mixed INT2/BF16 cache.

``paged_decode_attention_triton`` computes :func:`oscar_kernels.reference.paged.paged_decode`:
one query per sequence at position ``L - 1``, BF16 for positions ``< S`` and ``>= L - W``,
INT2 for the rest, output in the model's space.

Two kernels:

* ``_paged_decode_split_kernel``, grid ``(num_kv_heads, NWIN + num_splits, batch_size)``.
  One program owns one KV head of one sequence and *all* its ``GQA`` query heads (the
  query tile is ``[GP, D]``, ``GP = max(16, next_pow2(GQA))`` rows for ``tl.dot``), so
  every K/V byte is read once. At small batch it rotates its query rows itself
  (``q @ R_K[h]``, four quarter-column TF32 dots, scaled by ``sm_scale · log2 e``); at
  larger batch the launcher does it with one torch GEMM. Splits ``0..NWIN-1``
  read ``window_chunk`` rows each of the BF16 window slot (sink + ring, ``S + W`` rows,
  row validity from ``L``; at batch 1 one program for all 320 rows was the critical
  path: 83 µs at 8K context, bench1 of 2026-11-29); the other splits take
  equal ``BLOCK_N``-aligned slices of the INT2 range ``[S, L - W)``, reading
  ``[BLOCK_N, D/4]`` uint8 tiles through the page table (page id per token) and folding
  scale/zero in per token (see ``_blocks.py``). Each split writes its normalized partial
  output ``[GQA, D]``, already un-rotated (``o' @ R_V[h]^T``, TF32, in the epilogue), and
  its base-2 lse. The KV head is the fastest grid axis, so the programs of all heads of
  one token slice run together and share the NHD cache lines of codes and params in L2.
* ``_decode_merge_kernel``, grid ``(num_kv_heads, batch_size, D / BLOCK_DO)``: one-pass
  (online) log-sum-exp merge of the splits over ``BLOCK_DO`` output columns per program,
  written in ``q``'s dtype into ``out``, plus the natural-log lse. With
  ``unrotate_in_split=False`` it un-rotates instead (each column program then re-merges
  all ``D`` columns of the L2-resident partials).

Nothing dequantized is written to global memory; partials are ``B·H·parts·GQA·D`` floats
(``parts = NWIN + splits``). The launcher never reads device memory on the host (CUDA-graph
safe): the split count comes from ``batch_size``, ``num_kv_heads``, ``len(kv_indices)``
and the SM count; rotations are read through both strides (no copies).

Tiles (H200, notes and versions in perf/notes.md, raw sweeps in
perf/results/2026-11-29_h200_*decode*.json and ..._triton_*): ``BLOCK_N = 128`` tokens,
4 warps, 3 pipeline stages, registers capped at 128 so four programs share an SM
(64-token blocks, 8 warps, 256-token blocks and a per-warp split of the block with its
own softmax were slower). The loop is instruction/latency bound (~1040 SASS
instructions per 128-token iteration and thread, ~4.1 per 2-bit code), not byte bound:
1.04 TB/s at batch 32, 64K (1.198 ms, 1.62x FlashInfer BF16), 0.58 TB/s at batch 1
(0.067 ms, 1.13x FlashInfer; perf/results/2026-11-29_h200_triton_final_29f6ef5.md).

Constraints: ``head_dim`` in {64, 128, 256}; ``group_size`` in {D, D/2, D/4}; GQA ratio
<= 16 (else :class:`~oscar_kernels.errors.UnsupportedConfigError` from ``can_implement``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ._blocks import (_bf16_block, _int2_block, _int2_query, _int2_unscale, _rotate_quarter,
                      _unrotate)
from ._common import interpret_mode, num_sms, page_strides

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the decode kernels.

    Splits (``num_splits=None``): with ``target_programs`` set, ``ceil(target_programs /
    pairs)`` INT2 splits per (sequence, KV head) pair; otherwise a wave model over
    ``slots = num_SMs · programs_per_SM`` (``programs_per_SM = 65536 registers /
    (maxnreg · 32 · num_warps)``, 4 at the default 128): at most ``small_pairs`` pairs
    (latency bound, batch 1-2 at 8 heads) one wave with the window programs,
    ``(slots - pairs · NWIN) // pairs`` (61 at batch 1 on 132 SMs); at most ``slots / 4``
    pairs two waves, ``round(2 · slots / pairs)``; else one wave, ``round(slots / pairs)``.
    Either way capped so that a split averages at least ``min_split_tokens`` tokens.
    Measured on the H200, qwen3-8b (perf/results/2026-11-29_h200_triton_*): at 64K batch 1
    50 splits 0.0680 ms vs 61 0.0669 (128K: 0.1170 vs 0.1021; run1: 33 +11 %, 132 +30 %),
    batch 8 17 splits vs 9: -17 %, batch 32 2 splits vs 3: -17 %.

    ``maxnreg`` caps registers per thread: 128 lets four 4-warp programs share an SM
    without spills since the subnormal unpack (168: three; uncapped ~243: two).
    ``fast_unpack`` selects a PTX unpack, ``unpack`` which one (``"subnormal"``: 0.625
    instructions per code, or ``"magic"``: 1.5; see ``_blocks.py``; the interpreter runs
    the subnormal algebra with fp32 codes). ``unrotate_in_split`` applies ``R_V^T`` to each
    split's partial output in the split kernel (TF32), so the merge is a plain weighted
    sum over ``merge_cols`` columns per program (2.5 µs at batch 1, 64K, against 12 µs
    un-rotating in the merge and 17 µs before the one-pass merge); else the merge
    un-rotates (fp32, every column program re-merges all ``D`` columns). ``merge_elems`` /
    ``merge_warps`` size the merge's per-step tile (``BLOCK_S · GQA · columns`` fp32).
    ``rotate_in_kernel=False`` rotates the queries with one torch GEMM before the launch;
    ``None``: in the kernel (TF32) for at most ``small_pairs`` pairs, else the GEMM (fp32;
    at batch 8 and 32 it costs 9-18 µs of three torch kernels, 2026-11-29 final run; the
    in-kernel TF32 rotation was not timed there).
    """

    block_n: int = 128
    block_w: int = 32
    num_warps: int = 4
    num_stages: int = 3
    num_splits: int | None = None
    target_programs: int | None = None
    min_split_tokens: int = 256
    window_chunk: int = 64
    fast_unpack: bool = True
    unpack: str = "subnormal"
    unrotate_in_split: bool = True
    merge_cols: int = 32
    merge_elems: int = 8192
    merge_warps: int = 4
    maxnreg: int | None = 128
    rotate_in_kernel: bool | None = None
    small_pairs: int = 16

    def resolved(self, batch_size: int, num_kv_heads: int) -> "DecodeConfig":
        """The config with ``rotate_in_kernel`` filled in for this batch."""
        small = batch_size * num_kv_heads <= self.small_pairs
        return replace(
            self,
            rotate_in_kernel=small if self.rotate_in_kernel is None else self.rotate_in_kernel)

    def programs_per_sm(self) -> int:
        """Resident split programs per SM allowed by the register cap."""
        regs = self.maxnreg or 240
        return max(1, 65536 // (regs * 32 * self.num_warps))


def default_decode_config(device: torch.device) -> DecodeConfig:
    if interpret_mode(device):
        return DecodeConfig(block_n=32, block_w=32, num_warps=4, num_stages=1,
                            target_programs=8, min_split_tokens=32, window_chunk=32,
                            fast_unpack=False, merge_cols=16)
    return DecodeConfig()


def _unpack_mode(cfg: DecodeConfig, dot16: bool) -> int:
    """``UNPACK`` constexpr of ``_blocks``: 2 subnormal, 1 magic (PTX), 0 element-wise."""
    if cfg.unpack not in ("subnormal", "magic"):
        raise ValueError(
            f"DecodeConfig.unpack: expected 'subnormal' or 'magic', got {cfg.unpack!r}")
    if cfg.unpack == "subnormal" and (cfg.fast_unpack or not dot16):
        return 2
    return 1 if (dot16 and cfg.fast_unpack) else 0


def _num_splits(cfg: DecodeConfig, batch_size: int, num_kv_heads: int, token_bound: int,
                slots: int, nwin: int) -> int:
    """INT2 splits per (sequence, KV head) pair; see ``DecodeConfig``."""
    if cfg.num_splits is not None:
        return max(1, cfg.num_splits)
    pairs = batch_size * num_kv_heads
    if cfg.target_programs is not None:
        want = math.ceil(cfg.target_programs / pairs)
    elif pairs <= cfg.small_pairs:
        want = max(1, (slots - pairs * nwin) // pairs)
    else:
        waves = 2 if 4 * pairs <= slots else 1
        want = max(1, round(waves * slots / pairs))
    per_seq = max(1, token_bound // batch_size)
    return max(1, min(want, math.ceil(per_seq / cfg.min_split_tokens)))


@triton.jit
def _paged_decode_split_kernel(
    q_ptr, stride_qb, stride_qh,                       # q [B, Hq, D]
    rot_k_ptr, stride_rh, stride_rd, stride_rc,        # R_K [H, D, D] fp32 (any strides)
    rot_v_ptr, stride_vh, stride_vd, stride_vc,        # R_V [H, D, D] fp32 (any strides)
    k_codes, v_codes, sc_page, sc_slot, sc_head,       # [.., D/4] uint8
    k_params, v_params, sp_page, sp_slot, sp_head,     # [.., NG, 2]
    k_win, v_win, sw_slot, sw_row, sw_head,            # [slots, S+W, H, D] bf16
    kv_indptr, kv_indices, kv_last, wslots,            # page table, window slots
    part_o, part_lse, num_splits, qk_scale,            # [B, H, NWIN+splits, GQA, D], [.., GQA]
    PAGE_SIZE: tl.constexpr, SINK: tl.constexpr, RECENT: tl.constexpr,
    D: tl.constexpr, GQA: tl.constexpr, GP: tl.constexpr, NG: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, NWIN: tl.constexpr, WCHUNK: tl.constexpr,
    DOT16: tl.constexpr, UNPACK: tl.constexpr, QROT: tl.constexpr, UNROT: tl.constexpr,
):
    h = tl.program_id(0)
    sp = tl.program_id(1)
    b = tl.program_id(2)
    num_heads = tl.num_programs(0)
    PD: tl.constexpr = D // 4

    first = tl.load(kv_indptr + b)
    npages = tl.load(kv_indptr + b + 1) - first
    seq_len = tl.where(npages > 0, (npages - 1) * PAGE_SIZE + tl.load(kv_last + b), 0)

    r = tl.arange(0, GP)
    rmask = r < GQA
    qrows = q_ptr + b * stride_qb + (h * GQA + r) * stride_qh                # [GP] row pointers
    qmask = rmask
    if QROT:
        rb = rot_k_ptr + h * stride_rh
        # TF32 rotation: see _rotate_quarter (3xTF32 spilled here)
        q0 = _rotate_quarter(qrows, qmask, rb, stride_rd, stride_rc, 0, D, PD, "tf32")
        q1 = _rotate_quarter(qrows, qmask, rb, stride_rd, stride_rc, 1, D, PD, "tf32")
        q2 = _rotate_quarter(qrows, qmask, rb, stride_rd, stride_rc, 2, D, PD, "tf32")
        q3 = _rotate_quarter(qrows, qmask, rb, stride_rd, stride_rc, 3, D, PD, "tf32")
        q0 = q0 * qk_scale                                                   # [GP, PD]
        q1 = q1 * qk_scale
        q2 = q2 * qk_scale
        q3 = q3 * qk_scale
    else:
        # q already rotated and scaled by the launcher (fp32)
        jq = tl.arange(0, PD)
        qp = qrows[:, None] + jq[None, :]
        q0 = tl.load(qp, mask=qmask[:, None], other=0.0).to(tl.float32)
        q1 = tl.load(qp + PD, mask=qmask[:, None], other=0.0).to(tl.float32)
        q2 = tl.load(qp + 2 * PD, mask=qmask[:, None], other=0.0).to(tl.float32)
        q3 = tl.load(qp + 3 * PD, mask=qmask[:, None], other=0.0).to(tl.float32)

    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    a0 = tl.zeros([GP, PD], tl.float32)
    a1 = tl.zeros([GP, PD], tl.float32)
    a2 = tl.zeros([GP, PD], tl.float32)
    a3 = tl.zeros([GP, PD], tl.float32)
    z0 = tl.zeros([GP], tl.float32)
    z1 = tl.zeros([GP], tl.float32)
    z2 = tl.zeros([GP], tl.float32)
    z3 = tl.zeros([GP], tl.float32)

    if sp < NWIN:
        # BF16 window rows [sp·WCHUNK, (sp+1)·WCHUNK) of the slot: sink rows [0, min(S, L)),
        # ring rows of positions [max(S, L-W), L)
        wbase = tl.load(wslots + b).to(tl.int64) * sw_slot + h * sw_head
        rec_start = tl.maximum(seq_len - RECENT, SINK)
        num_recent = tl.maximum(seq_len - rec_start, 0)
        for w0 in range(0, WCHUNK, BLOCK_W):
            rows = sp * WCHUNK + w0 + tl.arange(0, BLOCK_W)
            ok = (rows < SINK) & (rows < seq_len)
            if RECENT > 0:
                ring = (rows - SINK - rec_start % RECENT + 2 * RECENT) % RECENT
                ok = ok | ((rows >= SINK) & (rows < SINK + RECENT) & (ring < num_recent))
            valid = tl.broadcast_to(ok[None, :], [GP, BLOCK_W])
            m_i, l_i, a0, a1, a2, a3 = _bf16_block(
                q0, q1, q2, q3, k_win, v_win, wbase + rows.to(tl.int64) * sw_row, ok, valid,
                m_i, l_i, a0, a1, a2, a3, PD, DOT16)
    else:
        qc0, qc1, qc2, qc3, qs0, qs1, qs2, qs3 = _int2_query(q0, q1, q2, q3, DOT16, UNPACK)
        lo = SINK
        hi = tl.maximum(seq_len - RECENT, SINK)
        chunk = tl.cdiv(tl.cdiv(hi - lo, num_splits), BLOCK_N) * BLOCK_N
        start = lo + (sp - NWIN) * chunk
        end = tl.minimum(start + chunk, hi)
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            nmask = offs < end
            page = tl.load(kv_indices + first + offs // PAGE_SIZE, mask=nmask, other=0).to(tl.int64)
            slot = (offs % PAGE_SIZE).to(tl.int64)
            cbase = page * sc_page + slot * sc_slot + h * sc_head
            pbase = page * sp_page + slot * sp_slot + h * sp_head
            valid = tl.broadcast_to(nmask[None, :], [GP, BLOCK_N])
            m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3 = _int2_block(
                qc0, qc1, qc2, qc3, qs0, qs1, qs2, qs3,
                k_codes, v_codes, cbase, k_params, v_params, pbase, nmask, valid,
                m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3, PD, NG, DOT16, UNPACK)
        a0, a1, a2, a3 = _int2_unscale(a0, a1, a2, a3, UNPACK)

    nonempty = l_i > 0
    inv = tl.where(nonempty, 1.0 / tl.where(nonempty, l_i, 1.0), 0.0)
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    row = ((b * num_heads + h) * (num_splits + NWIN) + sp) * GQA + r            # [GP]
    o0 = (a0 + z0[:, None]) * inv[:, None]
    o1 = (a1 + z1[:, None]) * inv[:, None]
    o2 = (a2 + z2[:, None]) * inv[:, None]
    o3 = (a3 + z3[:, None]) * inv[:, None]
    if UNROT:
        # partial already in model space: the merge is a plain weighted sum
        o = _unrotate(o0, o1, o2, o3, rot_v_ptr + h * stride_vh, stride_vd, stride_vc, D, PD,
                      DOT16)                                                # [GP, D]
        c = tl.arange(0, D)
        tl.store(part_o + row[:, None].to(tl.int64) * D + c[None, :], o, mask=rmask[:, None])
    else:
        j = tl.arange(0, PD)
        optr = part_o + row[:, None].to(tl.int64) * D + j[None, :]
        tl.store(optr, o0, mask=rmask[:, None])
        tl.store(optr + PD, o1, mask=rmask[:, None])
        tl.store(optr + 2 * PD, o2, mask=rmask[:, None])
        tl.store(optr + 3 * PD, o3, mask=rmask[:, None])
    tl.store(part_lse + row, lse, mask=rmask)


@triton.jit
def _decode_merge_kernel(
    part_o, part_lse, num_parts,                       # [B, H, parts, GQA, D], [.., GQA]
    rot_v_ptr, stride_rh, stride_rd, stride_rc,        # R_V [H, D, D] fp32 (ROT only)
    o_ptr, stride_ob, stride_oh,                       # [B, Hq, D] (q dtype)
    lse_ptr, stride_lb,                                # [B, Hq] fp32
    D: tl.constexpr, GQA: tl.constexpr, GM: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_DO: tl.constexpr, ROT: tl.constexpr,
):
    h = tl.program_id(0)
    b = tl.program_id(1)
    c0 = tl.program_id(2) * BLOCK_DO                   # this program's output columns
    num_heads = tl.num_programs(0)
    r = tl.arange(0, GM)
    rmask = r < GQA
    # partial columns this program reads: all D when it un-rotates (ROT), else its own
    DC: tl.constexpr = D if ROT else BLOCK_DO
    dd = (0 if ROT else c0) + tl.arange(0, DC)
    base = (b * num_heads + h).to(tl.int64) * num_parts
    # one pass, online: running max m, weight sum and weighted sum of the normalized
    # partial outputs, rescaled when the max grows (BLOCK_S splits per step)
    m = tl.full([GM], float("-inf"), tl.float32)
    wsum = tl.zeros([GM], tl.float32)
    acc = tl.zeros([GM, DC], tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = (s < num_parts)[:, None] & rmask[None, :]
        prow = (base + s)[:, None] * GQA + r[None, :]                       # [BLOCK_S, GM]
        ls = tl.load(part_lse + prow, mask=smask, other=float("-inf"))
        po = tl.load(part_o + prow[:, :, None] * D + dd[None, None, :], mask=smask[:, :, None],
                     other=0.0)                                             # [BLOCK_S, GM, DC]
        m_new = tl.maximum(m, tl.max(ls, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)                                         # 0 while m = -inf
        w = tl.exp2(ls - m_safe[None, :])                                   # [BLOCK_S, GM]
        wsum = wsum * alpha + tl.sum(w, axis=0)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * po, axis=0)
        m = m_new
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    has = wsum > 0
    o_part = acc / tl.where(has, wsum, 1.0)[:, None]                        # [GM, DC]
    heads = h * GQA + r
    if c0 == 0:
        lse = tl.where(has, (m_safe + tl.log2(tl.where(has, wsum, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads, lse, mask=rmask)
    c = c0 + tl.arange(0, BLOCK_DO)
    if ROT:
        # un-rotate: o[:, c] = sum_k o'[:, k] * R_V[h][c, k] for c in this program's columns
        rv = tl.load(rot_v_ptr + h * stride_rh + c[:, None] * stride_rd
                     + dd[None, :] * stride_rc)                             # [BDO, D]
        out = tl.sum(o_part[:, None, :] * rv[None, :, :], axis=2)           # [GM, BLOCK_DO]
    else:
        out = o_part
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + c[None, :],
             out.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


def paged_decode_attention_triton(q: torch.Tensor, cache, kv_indptr: torch.Tensor,
                                  kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                                  window_slots: torch.Tensor, rot_k: torch.Tensor,
                                  rot_v: torch.Tensor, sm_scale: float, *,
                                  out: torch.Tensor | None = None,
                                  config: DecodeConfig | None = None
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of ``q [batch_size, num_qo_heads, head_dim]`` over ``cache``.

    Parameters
    ----------
    q : Tensor ``[batch_size, num_qo_heads, head_dim]`` bf16/fp16/fp32, model space.
    cache : Int2PagedKVCache
    kv_indptr, kv_indices, kv_last_page_len, window_slots : Tensor int32
        FlashInfer page table and window slots (lengths include the query's token).
    rot_k, rot_v : Tensor ``[num_kv_heads, head_dim, head_dim]`` float32 (stride-0 head ok).
    sm_scale : float
    out : Tensor, optional
        ``[batch_size, num_qo_heads, head_dim]`` of ``q.dtype``, written in place.
    config : DecodeConfig, optional
        Launch parameters (benchmarks sweep them); default per device.

    Returns
    -------
    ``o [batch_size, num_qo_heads, head_dim]`` (``q.dtype``, model space) and
    ``lse [batch_size, num_qo_heads]`` float32 (natural log; ``-inf`` for empty sequences).

    Example
    -------
    >>> # see tests/triton/test_triton_interp.py (CPU, TRITON_INTERPRET=1)
    """
    spec = cache.spec
    batch_size, num_qo_heads, d = q.shape
    h = spec.num_kv_heads
    gqa = num_qo_heads // h
    cfg = (config or default_decode_config(q.device)).resolved(batch_size, h)
    slots = num_sms(q.device, 4) * cfg.programs_per_sm()
    # window rows: several programs when few (sequence, head) pairs fill the GPU (batch 1:
    # the window was the critical path), one per pair otherwise
    wchunk = cfg.window_chunk
    if batch_size * h * 4 >= (cfg.target_programs or slots):
        wchunk = max(cfg.block_w, triton.cdiv(spec.window_size, cfg.block_w) * cfg.block_w)
    nwin = max(1, triton.cdiv(spec.window_size, wchunk))
    splits = _num_splits(cfg, batch_size, h, kv_indices.shape[0] * spec.page_size, slots, nwin)
    parts = splits + nwin
    if q.stride(-1) != 1:
        q = q.contiguous()
    part_o = torch.empty((batch_size, h, parts, gqa, d), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((batch_size, h, parts, gqa), dtype=torch.float32, device=q.device)
    result = out
    if out is None or out.stride(-1) != 1:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch_size, num_qo_heads), dtype=torch.float32, device=q.device)
    sc = page_strides(cache.k_codes, spec.kv_layout)
    sp = page_strides(cache.k_params, spec.kv_layout)
    sw = cache.k_window.stride()
    dot16 = not interpret_mode(q.device)
    gp = max(16, triton.next_power_of_2(gqa))
    q_in, qk_scale = q, float(sm_scale) * LOG2E
    if not cfg.rotate_in_kernel:
        # one batched fp32 GEMM: q' = (q @ R_K[h]) * sm_scale * log2(e), [B, Hq, D]
        q_in = torch.matmul(q.to(torch.float32).reshape(batch_size, h, gqa, d), rot_k[None])
        q_in = (q_in * qk_scale).view(batch_size, num_qo_heads, d)
        qk_scale = 1.0
    _paged_decode_split_kernel[(h, parts, batch_size)](
        q_in, q_in.stride(0), q_in.stride(1), rot_k, *rot_k.stride(), rot_v, *rot_v.stride(),
        cache.k_codes, cache.v_codes, *sc, cache.k_params, cache.v_params, *sp,
        cache.k_window, cache.v_window, sw[0], sw[1], sw[2],
        kv_indptr, kv_indices, kv_last_page_len, window_slots,
        part_o, part_lse, splits, qk_scale,
        PAGE_SIZE=spec.page_size, SINK=spec.sink_size, RECENT=spec.recent_size,
        D=d, GQA=gqa, GP=gp, NG=spec.num_groups, BLOCK_N=cfg.block_n, BLOCK_W=cfg.block_w,
        NWIN=nwin, WCHUNK=wchunk, DOT16=dot16, UNPACK=_unpack_mode(cfg, dot16),
        QROT=cfg.rotate_in_kernel, UNROT=cfg.unrotate_in_split,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg and not interpret_mode(q.device) else {}),
    )
    gm = triton.next_power_of_2(gqa)
    rot = not cfg.unrotate_in_split
    if rot:
        block_do = max(1, min(d, 8192 // (gm * d), 32))
        cols = d                                        # each program re-merges all columns
    else:
        block_do = cols = min(d, cfg.merge_cols)
    block_s = max(1, min(triton.next_power_of_2(parts), cfg.merge_elems // (gm * cols)))
    _decode_merge_kernel[(h, batch_size, d // block_do)](
        part_o, part_lse, parts, rot_v, *rot_v.stride(),
        out, out.stride(0), out.stride(1), lse, lse.stride(0),
        D=d, GQA=gqa, GM=gm, BLOCK_S=block_s, BLOCK_DO=block_do, ROT=rot,
        num_warps=cfg.merge_warps,
    )
    if result is not None and result.data_ptr() != out.data_ptr():
        result.copy_(out)
        out = result
    return out, lse


__all__ = ["paged_decode_attention_triton", "DecodeConfig", "default_decode_config"]
