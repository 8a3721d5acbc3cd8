"""The INT2 part of an extend as dense attention: dequantize, then a library BF16-class kernel.

An extend query at position ``t`` reads position ``p`` from the INT2 pages when
``S <= p <= t - W`` (docs/format.md). For one sequence of ``L`` tokens whose last ``n`` are
the chunk, those keys are the positions ``[S, L - W)`` and the visibility is a causal mask
aligned to the bottom right: with the keys numbered ``j = p - S`` and the queries ``i``,
query ``i`` sees ``j <= i + (L_k - n)``, ``L_k = L - W - S``. So the INT2 part is ordinary
causal attention over dequantized keys, which the best dense attention kernels run near
the tensor cores' rate.

:func:`int2_part_dense` writes what ``_extend_int2_kernel`` writes (the unnormalized
partial ``(m, l, o)`` per (token, query head), in rotated space, ``m`` in log2 units of the
scaled score) for ``_paged_extend_kernel`` to merge with the BF16 rows:

1. ``_dequant_rows_kernel`` writes the INT2 rows of one sequence, in tiles of at most
   ``DENSE_TILE_TOKENS`` positions, as ``zero + scale * code`` (fp32, then fp16: exact
   up to the fp16 rounding of the dequantized value) into a bounded workspace
   ``[num_kv_heads, tokens, head_dim]``;
2. the queries (rotated once, fp16) attend each tile: tiles entirely below the first
   query's horizon without a mask (all ``GQA`` heads of a KV head folded into the query
   rows, one call), the last ``n'`` keys with a top-left causal mask (the bottom-right
   diagonal shifted onto the chunk), each call returning its log-sum-exp;
3. the parts merge by their log-sum-exp (fp32).

Queries with no INT2 key (``t - W < S``) get ``m = -inf, l = 0, o = 0``.

The dense calls go to torch's cuDNN attention when it is there, else its flash attention
(:func:`attention_lse`); on a CPU they run as fp32 torch math, so the interpreter tests
run this whole path. The fp16 workspace holds ``2 x H x max(chunk, min(tile, keys)) x D``
values (256 MiB for 8 KV heads x 128 at the default 64K-token tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import page_strides

LOG2E = 1.4426950408889634
#: Positions dequantized per workspace tile (bounds the workspace; larger tiles mean fewer
#: dense calls to merge).
DENSE_TILE_TOKENS = 65536
#: Rows per program of the dequantize kernel.
DEQUANT_BLOCK_N = 64


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


def _math_attention_lse(q, k, v, causal: bool, scale: float):
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale
    if causal:
        lq, lk = s.shape[-2:]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
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
        return _math_attention_lse(q, k, v, causal, scale)
    try:
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False, scale=scale)
    except (RuntimeError, TypeError):
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)
    o, lse = res[0], res[1]
    return o, lse.reshape(q.shape[:3]).float()


def _merge(o_a, lse_a, o_b, lse_b):
    """Two normalized partials ``o [..., D]`` (fp32), ``lse [...]`` -> their union."""
    lse = torch.logaddexp(lse_a, lse_b)
    return (o_a * torch.exp(lse_a - lse)[..., None] + o_b * torch.exp(lse_b - lse)[..., None],
            lse)


def int2_part_dense(qr: torch.Tensor, cache, kv_indptr_host: list[int], kv_indices: torch.Tensor,
                    seq_lens_host: list[int], qo_host: list[int], sm_scale: float,
                    part_o: torch.Tensor, part_ml: torch.Tensor) -> None:
    """Fill ``part_o [nnz, Hq, D]`` / ``part_ml [nnz, Hq, 2]`` (fp32) with each query's
    attention over its INT2 keys (see the module docstring); ``qr [nnz, Hq, D]`` is the
    rotated, unscaled query (fp32). Sequences are attended one after another."""
    spec = cache.spec
    s_, w_ = spec.sink_size, spec.recent_size
    h, d = spec.num_kv_heads, spec.head_dim
    nnz, hq, _ = qr.shape
    g = hq // h
    dtype = torch.float16
    plans = []
    for b, seq_len in enumerate(seq_lens_host):
        n = qo_host[b + 1] - qo_host[b]
        lk = seq_len - w_ - s_                       # INT2 keys of the last query
        i0 = min(n, max(0, w_ + s_ - (seq_len - n)))  # first query with an INT2 key
        if lk <= 0:
            i0 = n
        if i0 > 0:                                   # rows without INT2 keys: empty partial
            empty = slice(qo_host[b], qo_host[b] + i0)
            part_o[empty] = 0.0
            part_ml[empty, :, 0] = float("-inf")
            part_ml[empty, :, 1] = 0.0
        if i0 < n:
            plans.append((b, i0, n - i0, lk - (n - i0)))  # (seq, first query, queries, free keys)
    if not plans:
        return
    ws_rows = max(max(lq for _, _, lq, _ in plans),
                  min(DENSE_TILE_TOKENS, max(off for *_, off in plans)))
    ws_k = torch.empty((h, ws_rows, d), dtype=dtype, device=qr.device)
    ws_v = torch.empty((h, ws_rows, d), dtype=dtype, device=qr.device)

    def load(b, k0, cnt):
        for codes, params, ws in ((cache.k_codes, cache.k_params, ws_k),
                                  (cache.v_codes, cache.v_params, ws_v)):
            dequantize_rows(codes, params, spec.kv_layout, kv_indices, kv_indptr_host[b],
                            s_ + k0, cnt, spec.page_size, spec.num_groups, ws)

    for b, i0, lq, off in plans:
        rows = slice(qo_host[b] + i0, qo_host[b] + i0 + lq)
        q16 = qr[rows].to(dtype)                                        # [lq, Hq, D]
        parts = []
        if off > 0:
            # keys [0, off): every query sees them (no mask; a KV head's GQA heads folded
            # into the query rows), in workspace tiles
            q_fold = q16.reshape(lq, h, g, d).permute(1, 2, 0, 3).reshape(1, h, g * lq, d)
            for k0 in range(0, off, DENSE_TILE_TOKENS):
                cnt = min(DENSE_TILE_TOKENS, off - k0)
                load(b, k0, cnt)
                o, lse = attention_lse(q_fold, ws_k[None, :, :cnt], ws_v[None, :, :cnt],
                                       False, sm_scale)
                parts.append((o.float().reshape(h, g, lq, d).permute(2, 0, 1, 3)
                              .reshape(lq, hq, d),
                              lse.reshape(h, g, lq).permute(2, 0, 1).reshape(lq, hq)))
        # keys [off, off + lq): query i sees key off + i' for i' <= i (top-left causal)
        load(b, off, lq)
        kc = ws_k[:, :lq].repeat_interleave(g, dim=0)[None]            # [1, Hq, lq, D]
        vc = ws_v[:, :lq].repeat_interleave(g, dim=0)[None]
        o, lse = attention_lse(q16.permute(1, 0, 2)[None], kc, vc, True, sm_scale)
        o_acc, lse_acc = o[0].float().permute(1, 0, 2), lse[0].permute(1, 0)
        for o, lse in parts:
            o_acc, lse_acc = _merge(o_acc, lse_acc, o, lse)
        part_o[rows] = o_acc
        part_ml[rows, :, 0] = lse_acc * LOG2E
        part_ml[rows, :, 1] = 1.0


__all__ = ["attention_lse", "dequantize_rows", "int2_part_dense", "DENSE_TILE_TOKENS"]
