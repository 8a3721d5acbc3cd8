"""Extend attention as dense library attention: dequantize, then BF16-class kernels.

An extend query at position ``t`` reads position ``p <= t`` in BF16 when ``p < S`` or
``p > t - W`` and from the INT2 pages otherwise (docs/format.md). Split the keys of each
query into two sets that ordinary masks describe:

* **the old keys** ``p <= t - W``: the sink rows (BF16) and the INT2 rows, both in one
  fp16 workspace. For a sequence of ``L`` tokens whose last ``n`` are the chunk, these are
  the positions ``[0, L - W)`` and query ``i`` sees ``p <= i + (L - W - n)``: causal
  attention aligned to the bottom right, run as an unmasked call over the keys every
  query sees (all ``GQA`` heads of a KV head folded into the query rows) plus a top-left
  causal call over the last ``n'`` keys (``_old_keys``);
* **the window** ``t - W < p <= t``: BF16 rows only (the ring as it was before the chunk,
  the sink rows and the chunk's own rows), a causal sliding window of ``W`` keys; one
  variable-length call for the whole batch (``_window_keys``).

Each call returns its log-sum-exp; ``_merge_part_kernel`` merges the old-key parts per
(token, query head) in fp32 and ``_merge_unrotate_kernel`` merges the window part, un-rotates
once (``o' @ R_V^T``) and stores ``o`` and the log-sum-exp.

Library kernels on CUDA: torch's cuDNN attention for the old keys (its flash attention when
cuDNN is not there), torch's variable-length flash attention with a sliding window for the
window. On a CPU both run as fp32 torch math, so the interpreter tests run this whole path.

The workspace holds ``2 x H x max(chunk, min(tile, keys)) x D`` fp16 values (256 MiB for 8
KV heads x 128 at the default 64K-token tile): ``_dequant_rows_kernel`` writes
``zero + scale * code`` (fp32, then fp16: exact up to the fp16 rounding of the dequantized
value) and the sink rows are copied from the window store (BF16 to fp16 is exact in fp16's
normal range).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import interpret_mode, page_strides

LOG2E = 1.4426950408889634
#: Positions dequantized per workspace tile (bounds the workspace; larger tiles mean fewer
#: dense calls to merge).
DENSE_TILE_TOKENS = 65536
#: Rows per program of the dequantize kernel.
DEQUANT_BLOCK_N = 64
#: Token rows per program of the merge kernels.
MERGE_BLOCK_R = 32
UNROTATE_BLOCK_R = 64
UNROTATE_WARPS = 8


@triton.jit
def _dequant_rows_kernel(
    codes_ptr, params_ptr, sc_page, sc_slot, sc_head, sp_page, sp_slot, sp_head,
    kv_indices, first_page, pos0, count,                 # one sequence: rows [pos0, pos0 + count)
    out_ptr, so_h, so_n,                                 # out [H, count, D] (D contiguous)
    PAGE_SIZE: tl.constexpr, D: tl.constexpr, NG: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``out[h, i, :] = zero + scale * code`` of position ``pos0 + i`` (fp32, then ``out``'s
    dtype); grid ``(cdiv(count, BLOCK_N), H)``."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    PD: tl.constexpr = D // 4
    GS: tl.constexpr = D // NG
    i = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = i < count
    pos = pos0 + i
    page = tl.load(kv_indices + first_page + pos // PAGE_SIZE, mask=ok, other=0).to(tl.int64)
    slot = (pos % PAGE_SIZE).to(tl.int64)
    cbase = page * sc_page + slot * sc_slot + h * sc_head
    pbase = page * sp_page + slot * sp_slot + h * sp_head
    j = tl.arange(0, PD)
    packed = tl.load(codes_ptr + cbase[:, None] + j[None, :], mask=ok[:, None], other=0).to(tl.int32)
    orow = out_ptr + h.to(tl.int64) * so_h + i.to(tl.int64)[:, None] * so_n
    for quarter in tl.static_range(4):
        c = ((packed >> (2 * quarter)) & 3).to(tl.float32)              # [BLOCK_N, PD]
        ch = quarter * PD + j                                           # channels
        grp = ch // GS
        pp = params_ptr + pbase[:, None] + grp[None, :] * 2
        scale = tl.load(pp, mask=ok[:, None], other=0.0).to(tl.float32)
        zero = tl.load(pp + 1, mask=ok[:, None], other=0.0).to(tl.float32)
        val = zero + scale * c
        tl.store(orow + ch[None, :], val.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def dequantize_rows(codes: torch.Tensor, params: torch.Tensor, kv_layout: str,
                    kv_indices: torch.Tensor, first_page: int, pos0: int, count: int,
                    page_size: int, num_groups: int, out: torch.Tensor) -> torch.Tensor:
    """Dequantize positions ``[pos0, pos0 + count)`` of the sequence whose page list starts
    at ``kv_indices[first_page]`` into ``out [num_kv_heads, >= count, head_dim]``."""
    h, _, d = out.shape
    sc = page_strides(codes, kv_layout)
    sp = page_strides(params, kv_layout)
    _dequant_rows_kernel[(triton.cdiv(count, DEQUANT_BLOCK_N), h)](
        codes, params, *sc, *sp, kv_indices, first_page, pos0, count,
        out, out.stride(0), out.stride(1),
        PAGE_SIZE=page_size, D=d, NG=num_groups, BLOCK_N=DEQUANT_BLOCK_N)
    return out


@triton.jit
def _rotate_rows_kernel(
    x_ptr, sx_n, sx_h, rot_ptr, out_ptr, so_n, so_h, nrows,   # x [n, Hq, D] @ R [H, D, D]
    GQA: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, DOT16: tl.constexpr,
):
    """``out = x @ R_K`` per query head (its KV head's ``R``), stored in ``out``'s dtype;
    grid ``(cdiv(nrows, BLOCK_R), Hq)``. With ``DOT16`` (GPU) one fp16 dot with fp32
    accumulation (``R``'s fp16 rounding, 2^-12, is below the fp16 output's); IEEE fp32 in
    the interpreter."""
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    hq = tl.program_id(1)
    ok = i < nrows
    d = tl.arange(0, D)
    i64 = i.to(tl.int64)
    x = tl.load(x_ptr + i64[:, None] * sx_n + hq * sx_h + d[None, :], mask=ok[:, None],
                other=0.0).to(tl.float32)
    r = tl.load(rot_ptr + (hq // GQA).to(tl.int64) * D * D + d[:, None] * D + d[None, :])
    if DOT16:
        y = tl.dot(x.to(tl.float16), r.to(tl.float16), out_dtype=tl.float32)
    else:
        y = tl.dot(x, r, input_precision="ieee")
    tl.store(out_ptr + i64[:, None] * so_n + hq * so_h + d[None, :],
             y.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def rotate_queries(q: torch.Tensor, rot_k: torch.Tensor, dtype=torch.float16) -> torch.Tensor:
    """``q [n, Hq, D] @ R_K`` (``rot_k [H, D, D]`` float32) as ``dtype``, one kernel."""
    n, hq, d = q.shape
    rot_k = rot_k.to(torch.float32).contiguous()
    out = torch.empty((n, hq, d), dtype=dtype, device=q.device)
    if n:
        _rotate_rows_kernel[(triton.cdiv(n, UNROTATE_BLOCK_R), hq)](
            q, q.stride(0), q.stride(1), rot_k, out, out.stride(0), out.stride(1), n,
            GQA=hq // rot_k.shape[0], D=d, BLOCK_R=UNROTATE_BLOCK_R,
            DOT16=not interpret_mode(q.device), num_warps=UNROTATE_WARPS)
    return out


@triton.jit
def _merge_part_kernel(
    acc_o, acc_lse, row0, nrows, HQ,                   # acc [nnz, HQ, D], [nnz, HQ] fp32
    src_o, so_n, so_h, src_lse, sl_n, sl_h,            # one part: rows [row0, row0 + nrows)
    D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """``acc <- acc ∪ part`` per (token, query head): normalized outputs weighted by their
    share of the union's log-sum-exp (``acc_lse = -inf``: no keys yet, ``acc_o`` unread).
    Grid ``(cdiv(nrows, BLOCK_R), HQ)``."""
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    hq = tl.program_id(1)
    ok = i < nrows
    d = tl.arange(0, D)
    i64 = i.to(tl.int64)
    lse_s = tl.load(src_lse + i64 * sl_n + hq * sl_h, mask=ok, other=float("-inf"))
    o_s = tl.load(src_o + i64[:, None] * so_n + hq * so_h + d[None, :], mask=ok[:, None],
                  other=0.0).to(tl.float32)
    arow = (row0 + i64) * HQ + hq
    lse_a = tl.load(acc_lse + arow, mask=ok, other=float("-inf"))
    has_a = lse_a > float("-inf")
    o_a = tl.load(acc_o + arow[:, None] * D + d[None, :], mask=(ok & has_a)[:, None], other=0.0)
    m = tl.maximum(lse_a, lse_s)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m_safe)
    ws = tl.exp(lse_s - m_safe)
    tot = wa + ws
    inv = tl.where(tot > 0, 1.0 / tl.where(tot > 0, tot, 1.0), 0.0)
    o = (o_a * wa[:, None] + o_s * ws[:, None]) * inv[:, None]
    lse = tl.where(tot > 0, m_safe + tl.log(tl.where(tot > 0, tot, 1.0)), float("-inf"))
    tl.store(acc_o + arow[:, None] * D + d[None, :], o, mask=ok[:, None])
    tl.store(acc_lse + arow, lse, mask=ok)


@triton.jit
def _merge_unrotate_kernel(
    acc_o, acc_lse, nnz,                               # old-key parts [nnz, HQ, D], [nnz, HQ]
    win_o, sw_n, sw_h, win_lse, swl_n, swl_h,          # window part
    rot_vt,                                            # R_V^T [H, D, D] fp32, contiguous
    out_ptr, so_n, so_h, lse_ptr, sl_n,                # out [nnz, HQ, D], lse [nnz, HQ]
    HQ: tl.constexpr, GQA: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr,
    DOT16: tl.constexpr,
):
    """``o = (old ∪ window) @ R_V^T`` and the union's log-sum-exp; grid
    ``(cdiv(nnz, BLOCK_R), HQ)``. The un-rotation is one fp16 dot with fp32 accumulation
    with ``DOT16`` (GPU; 2^-11 relative, below the bf16 output's rounding), IEEE fp32 in
    the interpreter."""
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    hq = tl.program_id(1)
    ok = i < nnz
    d = tl.arange(0, D)
    i64 = i.to(tl.int64)
    lse_w = tl.load(win_lse + i64 * swl_n + hq * swl_h, mask=ok, other=float("-inf"))
    o_w = tl.load(win_o + i64[:, None] * sw_n + hq * sw_h + d[None, :], mask=ok[:, None],
                  other=0.0).to(tl.float32)
    arow = i64 * HQ + hq
    lse_a = tl.load(acc_lse + arow, mask=ok, other=float("-inf"))
    has_a = lse_a > float("-inf")
    o_a = tl.load(acc_o + arow[:, None] * D + d[None, :], mask=(ok & has_a)[:, None], other=0.0)
    m = tl.maximum(lse_a, lse_w)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m_safe)
    ww = tl.exp(lse_w - m_safe)
    tot = wa + ww
    inv = tl.where(tot > 0, 1.0 / tl.where(tot > 0, tot, 1.0), 0.0)
    o = (o_a * wa[:, None] + o_w * ww[:, None]) * inv[:, None]
    lse = tl.where(tot > 0, m_safe + tl.log(tl.where(tot > 0, tot, 1.0)), float("-inf"))
    # un-rotate: o @ R_V^T (rows of R_V^T read contiguously)
    rt = tl.load(rot_vt + (hq // GQA).to(tl.int64) * D * D + d[:, None] * D + d[None, :])
    if DOT16:
        res = tl.dot(o.to(tl.float16), rt.to(tl.float16), out_dtype=tl.float32)
    else:
        res = tl.dot(o, rt, input_precision="ieee")
    tl.store(out_ptr + i64[:, None] * so_n + hq * so_h + d[None, :],
             res.to(out_ptr.dtype.element_ty), mask=ok[:, None])
    tl.store(lse_ptr + i64 * sl_n + hq, lse, mask=ok)


def _math_attention_lse(q, k, v, scale: float, diag: int | None, window: int | None = None):
    """fp32 reference of the library calls: ``q [B, H, Lq, D]``, ``k``, ``v [B, H, Lk, D]``;
    with ``diag``, query ``i`` sees key ``j <= i + diag`` (and ``j > i + diag - window``)."""
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale
    if diag is not None:
        lq, lk = s.shape[-2:]
        rel = (torch.arange(lk, device=s.device)[None, :]
               - torch.arange(lq, device=s.device)[:, None] - diag)
        vis = rel <= 0
        if window is not None:
            vis &= rel > -window
        s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), v.float())
    return o, lse


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(scale q k^T [+ top-left causal mask]) v`` and its natural log-sum-exp.

    ``q [B, H, Lq, D]``, ``k``, ``v [B, H, Lk, D]`` (fp16 or bf16) -> ``o [B, H, Lq, D]``
    (q's dtype on CUDA, fp32 on CPU), ``lse [B, H, Lq]`` fp32. CUDA: torch's cuDNN
    attention, else its flash attention; CPU: fp32 math.
    """
    if q.device.type != "cuda":
        return _math_attention_lse(q, k, v, scale, 0 if causal else None)
    try:
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False, scale=scale)
    except (RuntimeError, TypeError):
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)
    o, lse = res[0], res[1]
    return o, lse.reshape(q.shape[:3]).float()


def window_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: list[int],
                         cu_k: list[int], window: int, scale: float,
                         cu_dev: tuple[torch.Tensor, torch.Tensor] | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length causal sliding-window attention, aligned to the bottom right.

    Sequence ``b`` has queries ``q[cu_q[b]:cu_q[b+1]]`` and keys ``k[cu_k[b]:cu_k[b+1]]``
    (``q [Nq, Hq, D]``, ``k``, ``v [Nk, H, D]``, ``Hq`` a multiple of ``H``); its query ``i``
    sees key ``j`` when ``i + Lk - Lq - window < j <= i + Lk - Lq``. ``cu_dev``: the offsets
    as int32 device tensors, when the caller has them. Returns ``o [Nq, Hq, D]`` and the
    natural log-sum-exp ``lse [Nq, Hq]`` (a strided view). CUDA: torch's variable-length
    flash attention; CPU: fp32 math.
    """
    nq, hq, d = q.shape
    g = hq // k.shape[1]
    if q.device.type == "cuda":
        dev = q.device
        if cu_dev is None:
            cu_dev = tuple(torch.tensor(c, dtype=torch.int32).to(dev) for c in (cu_q, cu_k))
        lens_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
        lens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
        o, lse = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_dev[0], cu_dev[1], max(lens_q), max(lens_k), 0.0, True, False,
            scale=scale, window_size_left=window - 1, window_size_right=0)[:2]
        if lse.dim() == 2:                              # [Hq, Nq]
            return o, lse.t()
        # [B, Hq, max_q] (padded per sequence)
        rows = torch.cat([torch.arange(n) for n in lens_q]).to(dev)
        seq = torch.repeat_interleave(torch.arange(len(lens_q)), torch.tensor(lens_q)).to(dev)
        return o, lse[seq, :, rows]
    o = torch.empty((nq, hq, d), dtype=torch.float32, device=q.device)
    lse = torch.empty((nq, hq), dtype=torch.float32, device=q.device)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        lq, lk = qs.stop - qs.start, ks.stop - ks.start
        if lq == 0:
            continue
        kk = k[ks].repeat_interleave(g, dim=1).permute(1, 0, 2)[None]
        vv = v[ks].repeat_interleave(g, dim=1).permute(1, 0, 2)[None]
        ob, lb = _math_attention_lse(q[qs].permute(1, 0, 2)[None], kk, vv, scale, lk - lq, window)
        o[qs] = ob[0].permute(1, 0, 2)
        lse[qs] = lb[0].t()
    return o, lse


def _merge_part(acc_o, acc_lse, row0: int, o, lse) -> None:
    """Merge one part ``o [rows, Hq, D]`` / ``lse [rows, Hq]`` (any strides, D contiguous)
    into ``acc`` rows ``[row0, row0 + rows)``."""
    nrows, hq, d = o.shape
    if o.stride(-1) != 1:
        o = o.contiguous()
    _merge_part_kernel[(triton.cdiv(nrows, MERGE_BLOCK_R), hq)](
        acc_o, acc_lse, row0, nrows, hq, o, o.stride(0), o.stride(1), lse, lse.stride(0),
        lse.stride(1), D=d, BLOCK_R=MERGE_BLOCK_R)


def _seq_plan(seq_len: int, n: int, sink: int, recent: int) -> tuple[int, int, int]:
    """One sequence's old-key geometry: ``(i0, lq, off)``: its first query with an old key
    (``t - W >= 0``), how many queries have one, and how many keys all of them see."""
    prefix = seq_len - n
    lk = seq_len - recent                           # old keys of the last query
    i0 = min(n, max(0, recent - prefix))
    if lk <= 0:
        i0 = n
    lq = n - i0
    return i0, lq, lk - lq


def _old_keys(qh, cache, slot: int, kv_indices, first_page: int, seq_len: int, row0: int,
              n: int, sm_scale: float, acc_o, acc_lse, ws_k, ws_v) -> None:
    """Merge into ``acc`` the attention of one sequence's chunk queries over their old keys
    (positions ``p <= t - W``; the module docstring)."""
    spec = cache.spec
    s_, w_ = spec.sink_size, spec.recent_size
    h, d = spec.num_kv_heads, spec.head_dim
    hq = qh.shape[1]
    g = hq // h
    i0, lq, off = _seq_plan(seq_len, n, s_, w_)
    if lq == 0:
        return
    rows = slice(row0 + i0, row0 + n)

    def load(k0: int, cnt: int) -> None:
        """Workspace rows ``[0, cnt)`` = positions ``[k0, k0 + cnt)``: sink rows copied,
        the rest dequantized."""
        sink_hi = min(s_, k0 + cnt)
        for win, codes, params, ws in ((cache.k_window, cache.k_codes, cache.k_params, ws_k),
                                       (cache.v_window, cache.v_codes, cache.v_params, ws_v)):
            if k0 < sink_hi:
                ws[:, :sink_hi - k0].copy_(win[slot, k0:sink_hi].permute(1, 0, 2))
            lo = max(k0, s_)
            if lo < k0 + cnt:
                dequantize_rows(codes, params, spec.kv_layout, kv_indices, first_page, lo,
                                k0 + cnt - lo, spec.page_size, spec.num_groups,
                                ws[:, lo - k0:])

    q16 = qh[rows]                                                     # [lq, Hq, D]
    if off > 0:
        # keys [0, off): every query sees them (no mask; a KV head's GQA heads folded into
        # the query rows, so the output is [Hq, lq, D] in memory), in workspace tiles
        q_fold = q16.reshape(lq, h, g, d).permute(1, 2, 0, 3).reshape(1, h, g * lq, d)
        for k0 in range(0, off, DENSE_TILE_TOKENS):
            cnt = min(DENSE_TILE_TOKENS, off - k0)
            load(k0, cnt)
            o, lse = attention_lse(q_fold, ws_k[None, :, :cnt], ws_v[None, :, :cnt], False,
                                   sm_scale)
            o = o.reshape(hq, lq, d)
            _merge_part(acc_o, acc_lse, rows.start, o.permute(1, 0, 2),
                        lse.reshape(hq, lq).t())
    # keys [off, off + lq): query i sees key off + i' for i' <= i (top-left causal)
    load(off, lq)
    kc = ws_k[:, :lq].repeat_interleave(g, dim=0)[None]                # [1, Hq, lq, D]
    vc = ws_v[:, :lq].repeat_interleave(g, dim=0)[None]
    o, lse = attention_lse(q16.permute(1, 0, 2)[None], kc, vc, True, sm_scale)
    _merge_part(acc_o, acc_lse, rows.start, o[0].permute(1, 0, 2), lse[0].t())


def window_row_indices(spec, window_slots: list[int], seq_lens: list[int], qo: list[int]
                       ) -> tuple[list[int], list[torch.Tensor]]:
    """Where the window part's BF16 rows come from, per sequence positions
    ``[max(0, prefix - W + 1), seq_len)`` in order: the pre-chunk positions from the window
    store (sink row ``p`` or ring row ``S + p % W``), then the chunk's rotated rows. Returns
    the key offsets ``cu_k`` and the host index tensors ``(old_dst, old_slot, old_row,
    new_dst, new_src)``."""
    s_, w_ = spec.sink_size, spec.recent_size
    cu_k = [0]
    parts = [[], [], [], [], []]
    for b, seq_len in enumerate(seq_lens):
        n = qo[b + 1] - qo[b]
        prefix = seq_len - n
        lo = max(0, prefix - w_ + 1)
        p = torch.arange(lo, prefix)
        parts[0].append(cu_k[-1] + p - lo)
        parts[1].append(torch.full_like(p, window_slots[b]))
        parts[2].append(torch.where(p < s_, p, s_ + p % max(w_, 1)))
        parts[3].append(cu_k[-1] + prefix - lo + torch.arange(n))
        parts[4].append(torch.arange(qo[b], qo[b + 1]))
        cu_k.append(cu_k[-1] + seq_len - lo)
    return cu_k, [torch.cat(x) for x in parts]


def ring_row_indices(spec, window_slots: list[int], seq_lens: list[int], qo: list[int]
                     ) -> list[torch.Tensor]:
    """The chunk's rows that end in the recent window (``p >= max(S, L - W)``): host index
    tensors ``(slot, ring row S + p % W, chunk row)``."""
    s_, w_ = spec.sink_size, spec.recent_size
    parts = [[], [], []]
    for b, seq_len in enumerate(seq_lens):
        n = qo[b + 1] - qo[b]
        prefix = seq_len - n
        p = torch.arange(max(s_, seq_len - w_, prefix), seq_len) if w_ else torch.arange(0)
        parts[0].append(torch.full_like(p, window_slots[b]))
        parts[1].append(s_ + p % max(w_, 1))
        parts[2].append(qo[b] + p - prefix)
    return [torch.cat(x) for x in parts]


def gather_window_rows(cache, k_new: torch.Tensor, v_new: torch.Tensor, idx, total: int,
                       dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The window part's keys / values ``[total, H, D]`` (``dtype``) from the window store
    and the chunk's rotated rows, by the device indices of :func:`window_row_indices`."""
    spec = cache.spec
    o_dst, o_slot, o_row, n_dst, n_src = idx
    out = []
    for win, new in ((cache.k_window, k_new), (cache.v_window, v_new)):
        kb = torch.empty((total, spec.num_kv_heads, spec.head_dim), dtype=dtype,
                         device=k_new.device)
        if o_dst.numel():
            kb[o_dst] = win[o_slot, o_row].to(dtype)
        kb[n_dst] = new[n_src].to(dtype)
        out.append(kb)
    return out[0], out[1]


def write_ring_rows(cache, k_new: torch.Tensor, v_new: torch.Tensor, idx) -> None:
    """The chunk's recent rows into their ring rows, from the rotated BF16 rows the
    attention read (what the append kernel's ring pass writes, without rotating the chunk
    again); ``idx``: the device indices of :func:`ring_row_indices`."""
    sl, rw, sr = idx
    if sl.numel():
        cache.k_window[sl, rw] = k_new[sr]
        cache.v_window[sl, rw] = v_new[sr]


def extend_attention_dense(qh: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                           cache, kv_indices: torch.Tensor, plan, rot_v: torch.Tensor,
                           sm_scale: float, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Attention of an extend whose pages and sink rows are written and whose ring is not
    (the pre-chunk ring is read): ``qh [nnz, Hq, D]`` is the rotated, unscaled query (fp16),
    ``k_new``/``v_new [nnz, H, D]`` the chunk's rotated BF16 rows, ``plan`` the batch's
    :class:`~oscar_kernels.triton.paged_extend.ExtendPlan`. Writes ``out [nnz, Hq, D]``
    (model space) and ``lse [nnz, Hq]`` (natural log)."""
    spec = cache.spec
    h, d = spec.num_kv_heads, spec.head_dim
    nnz, hq, _ = qh.shape
    dtype = qh.dtype
    acc_o = torch.empty((nnz, hq, d), dtype=torch.float32, device=qh.device)
    acc_lse = torch.full((nnz, hq), float("-inf"), dtype=torch.float32, device=qh.device)
    lens, qo = plan.seq_lens, plan.qo
    plans = [_seq_plan(n_, qo[b + 1] - qo[b], spec.sink_size, spec.recent_size)
             for b, n_ in enumerate(lens)]
    need = [(lq, off) for _, lq, off in plans if lq > 0]
    if need:
        ws_rows = max(max(lq for lq, _ in need), min(DENSE_TILE_TOKENS, max(o for _, o in need)))
        ws_k = torch.empty((h, ws_rows, d), dtype=dtype, device=qh.device)
        ws_v = torch.empty((h, ws_rows, d), dtype=dtype, device=qh.device)
        for b, seq_len in enumerate(lens):
            _old_keys(qh, cache, plan.window_slots[b], kv_indices, plan.kv_indptr[b], seq_len,
                      qo[b], qo[b + 1] - qo[b], sm_scale, acc_o, acc_lse, ws_k, ws_v)
    if spec.recent_size > 0:
        kb, vb = gather_window_rows(cache, k_new, v_new, plan.window_idx, plan.cu_k[-1], dtype)
        o_w, lse_w = window_attention_lse(qh, kb, vb, qo, plan.cu_k, spec.recent_size,
                                          sm_scale, plan.cu_dev)
    else:                                          # no window: an empty part
        o_w = torch.zeros((1, 1, d), dtype=torch.float32, device=qh.device).expand(nnz, hq, d)
        lse_w = torch.full((1, 1), float("-inf"), device=qh.device).expand(nnz, hq)
    if o_w.stride(-1) != 1:
        o_w = o_w.contiguous()
    rot_vt = rot_v.to(torch.float32).transpose(1, 2).contiguous()
    _merge_unrotate_kernel[(triton.cdiv(nnz, UNROTATE_BLOCK_R), hq)](
        acc_o, acc_lse, nnz, o_w, o_w.stride(0), o_w.stride(1), lse_w, lse_w.stride(0),
        lse_w.stride(1), rot_vt, out, out.stride(0), out.stride(1), lse, lse.stride(0),
        HQ=hq, GQA=hq // h, D=d, BLOCK_R=UNROTATE_BLOCK_R, DOT16=not interpret_mode(qh.device),
        num_warps=UNROTATE_WARPS)


__all__ = ["attention_lse", "dequantize_rows", "extend_attention_dense", "gather_window_rows",
           "ring_row_indices", "rotate_queries", "window_attention_lse", "window_row_indices",
           "write_ring_rows", "DENSE_TILE_TOKENS"]
