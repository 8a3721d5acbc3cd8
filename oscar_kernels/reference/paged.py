"""Executable spec of the paged mixed-precision cache: append, decode, extend.

Pure torch, float32, any device (tests run it on the CPU). Functions take the cache as
any object with the attributes of :class:`oscar_kernels.cache.Int2PagedKVCache`
(``spec``, ``k_codes``, ``k_params``, ``v_codes``, ``v_params``, ``k_window``,
``v_window``) so this module does not import upward. Inputs are assumed valid: the
public ops in :mod:`oscar_kernels.ops` validate.

Shapes use one vocabulary: ``batch_size``, ``nnz`` (new tokens), ``num_kv_heads`` (H),
``num_qo_heads`` (Hq), ``head_dim`` (D). Rotations are ``[H, D, D]`` float32, one per KV
head (a per-layer rotation is expanded to all heads).
"""

from __future__ import annotations

import torch

from ..spec import seq_lens_from_page_table
from .quant import dequantize_groups, pack_codes, quantize_groups, unpack_codes


def page_view(t: torch.Tensor, kv_layout: str) -> torch.Tensor:
    """View a page tensor as NHD: ``[num_pages, page_size, H, ...]`` (no copy)."""
    return t if kv_layout == "NHD" else t.transpose(1, 2)


def rotate(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """``x [N, H, D]`` → ``x @ rot[h]`` per head, float32. ``rot`` is ``[H, D, D]``."""
    return torch.einsum("nhd,hde->nhe", x.to(torch.float32), rot.to(torch.float32))


def rotate_queries(q: torch.Tensor, rot_k: torch.Tensor) -> torch.Tensor:
    """``q [N, Hq, D]`` rotated by the ``R_K`` of each query head's KV head (GQA)."""
    group = q.shape[1] // rot_k.shape[0]
    return rotate(q, rot_k.repeat_interleave(group, dim=0))


def unrotate_output(o: torch.Tensor, rot_v: torch.Tensor) -> torch.Tensor:
    """``o [N, Hq, D]`` (rotated space) → ``o @ R_V[h].T`` per query head's KV head."""
    group = o.shape[1] // rot_v.shape[0]
    return rotate(o, rot_v.repeat_interleave(group, dim=0).transpose(-1, -2))


def quantize_rows(x_rot: torch.Tensor, group_size: int, ratio: float,
                  scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated rows ``[..., D]`` float32 → packed codes ``[..., D/4]`` uint8 and
    params ``[..., D/group_size, 2]`` (scale, zero) in ``scale_dtype``."""
    codes, scale, zero = quantize_groups(x_rot, group_size, ratio, scale_dtype)
    return pack_codes(codes), torch.stack([scale, zero], dim=-1)


def dequantize_rows(packed: torch.Tensor, params: torch.Tensor, group_size: int) -> torch.Tensor:
    """Inverse of :func:`quantize_rows` up to quantization error, float32."""
    return dequantize_groups(unpack_codes(packed), params[..., 0], params[..., 1], group_size)


def _token_pages(kv_indices, kv_indptr, batch_indices, positions, page_size):
    b = batch_indices.long()
    p = positions.long()
    page = kv_indices.long()[kv_indptr.long()[b] + p // page_size]
    return page, p % page_size


def append_paged_kv(cache, append_key: torch.Tensor, append_value: torch.Tensor,
                    batch_indices: torch.Tensor, positions: torch.Tensor,
                    kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                    kv_last_page_len: torch.Tensor, window_slots: torch.Tensor,
                    rot_k: torch.Tensor, rot_v: torch.Tensor, k_clip: float, v_clip: float,
                    *, write_pages: bool = True, write_recent: bool = True) -> None:
    """Rotate, clip, quantize, pack and store ``nnz`` new tokens (in place).

    ``append_key/value [nnz, H, D]``; token ``i`` belongs to sequence
    ``batch_indices[i]`` at ``positions[i]``; the page table already covers it and
    ``kv_last_page_len`` gives each sequence's length *after* the append.

    ``write_pages`` stores INT2 codes/params of every token and the BF16 sink rows;
    ``write_recent`` stores the BF16 recent-ring rows of tokens that end inside the
    recent window (``position >= seq_len - recent_size``).
    """
    spec = cache.spec
    s, w = spec.sink_size, spec.recent_size
    seq_lens = seq_lens_from_page_table(kv_indptr, kv_last_page_len, spec.page_size)
    page, slot = _token_pages(kv_indices, kv_indptr, batch_indices, positions, spec.page_size)
    b = batch_indices.long()
    p = positions.long()
    ws = window_slots.long()[b]
    for name, x, rot, ratio in (("k", append_key, rot_k, k_clip), ("v", append_value, rot_v, v_clip)):
        xr = rotate(x, rot)
        window = getattr(cache, f"{name}_window")
        if write_pages:
            packed, params = quantize_rows(xr, spec.group_size, ratio, spec.scale_dtype)
            page_view(getattr(cache, f"{name}_codes"), spec.kv_layout)[page, slot] = packed
            page_view(getattr(cache, f"{name}_params"), spec.kv_layout)[page, slot] = params
            sink = p < s
            window[ws[sink], p[sink]] = xr[sink].to(window.dtype)
        if write_recent and w > 0:
            rec = (p >= s) & (p >= seq_lens[b] - w)
            window[ws[rec], s + p[rec] % w] = xr[rec].to(window.dtype)


def gather_int2(cache, pages: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized K and V ``[seq_len, H, D]`` float32 (rotated space) of one sequence
    whose page list is ``pages``."""
    spec = cache.spec
    out = []
    for name in ("k", "v"):
        codes = page_view(getattr(cache, f"{name}_codes"), spec.kv_layout)[pages.long()]
        params = page_view(getattr(cache, f"{name}_params"), spec.kv_layout)[pages.long()]
        codes = codes.reshape(-1, *codes.shape[2:])[:seq_len]
        params = params.reshape(-1, *params.shape[2:])[:seq_len]
        out.append(dequantize_rows(codes, params, spec.group_size))
    return out[0], out[1]


def gather_window(cache, window_slot: int, positions: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """BF16 window rows (as float32) of ``positions`` (each inside the sink or the ring)."""
    s, w = cache.spec.sink_size, cache.spec.recent_size
    p = positions.long()
    rows = torch.where(p < s, p, s + (p % w if w > 0 else p))
    return (cache.k_window[window_slot, rows].to(torch.float32),
            cache.v_window[window_slot, rows].to(torch.float32))


def window_rule_attention(q_rot: torch.Tensor, q_positions: torch.Tensor,
                          k_int2: torch.Tensor, v_int2: torch.Tensor,
                          k_bf16: torch.Tensor, v_bf16: torch.Tensor,
                          sink_size: int, recent_size: int, sm_scale: float
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention every backend computes, in rotated space.

    Query ``i`` at position ``t = q_positions[i]`` attends causally to key positions
    ``p <= t`` and reads position ``p`` at full precision (``k_bf16/v_bf16``) when
    ``p < sink_size`` or ``p > t - recent_size``, INT2 (``k_int2/v_int2``) otherwise.

    ``q_rot [Nq, Hq, D]``; ``k_*, v_* [L, H, D]`` float32; rows of ``k_bf16/v_bf16``
    never selected may hold anything finite. Returns ``o_rot [Nq, Hq, D]`` and the
    natural-log ``lse [Nq, Hq]`` of the scaled scores (``-inf`` and ``o = 0`` when a
    query sees no key).
    """
    nq, hq, d = q_rot.shape
    length, h, _ = k_int2.shape
    group = hq // h
    pos = torch.arange(length, device=q_rot.device)
    t = q_positions.long()[:, None]
    visible = pos[None, :] <= t
    full = (pos[None, :] < sink_size) | (pos[None, :] > t - recent_size)
    kh = lambda x: x.repeat_interleave(group, dim=1)  # noqa: E731  [L, Hq, D]
    s_int2 = torch.einsum("qhd,lhd->qhl", q_rot, kh(k_int2))
    s_bf16 = torch.einsum("qhd,lhd->qhl", q_rot, kh(k_bf16))
    scores = torch.where(full[:, None, :], s_bf16, s_int2) * sm_scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    p_full = probs * full[:, None, :]
    p_int2 = probs * (~full)[:, None, :]
    o = (torch.einsum("qhl,lhd->qhd", p_full, kh(v_bf16))
         + torch.einsum("qhl,lhd->qhd", p_int2, kh(v_int2)))
    return o, lse


def _sequence_kv(cache, b: int, seq_len: int, kv_indices, kv_indptr, window_slots):
    spec = cache.spec
    pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])]
    k_int2, v_int2 = gather_int2(cache, pages, seq_len)
    s, w = spec.sink_size, spec.recent_size
    pos = torch.arange(seq_len, device=k_int2.device)
    in_window = (pos < s) | (pos >= seq_len - w)
    k_full, v_full = k_int2.clone(), v_int2.clone()
    if bool(in_window.any()):
        kw, vw = gather_window(cache, int(window_slots[b]), pos[in_window])
        k_full[in_window] = kw
        v_full[in_window] = vw
    return k_int2, v_int2, k_full, v_full


def paged_decode(q: torch.Tensor, cache, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 kv_last_page_len: torch.Tensor, window_slots: torch.Tensor,
                 rot_k: torch.Tensor, rot_v: torch.Tensor, sm_scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One query per sequence, ``q [batch_size, Hq, D]``, at position ``seq_len - 1``.

    Returns ``o [batch_size, Hq, D]`` float32 (original space) and ``lse [batch_size, Hq]``.
    """
    spec = cache.spec
    seq_lens = seq_lens_from_page_table(kv_indptr, kv_last_page_len, spec.page_size)
    q_rot = rotate_queries(q, rot_k)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        length = int(seq_lens[b])
        if length == 0:
            continue
        k_int2, v_int2, k_full, v_full = _sequence_kv(cache, b, length, kv_indices, kv_indptr,
                                                      window_slots)
        t_query = torch.tensor([length - 1], device=q.device)
        o_b, lse_b = window_rule_attention(q_rot[b:b + 1], t_query, k_int2, v_int2, k_full, v_full,
                                           spec.sink_size, spec.recent_size, sm_scale)
        out[b] = o_b[0]
        lse[b] = lse_b[0]
    return unrotate_output(out, rot_v), lse


def paged_extend(q: torch.Tensor, append_key: torch.Tensor, append_value: torch.Tensor,
                 qo_indptr: torch.Tensor, cache, kv_indptr: torch.Tensor,
                 kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                 window_slots: torch.Tensor, rot_k: torch.Tensor, rot_v: torch.Tensor,
                 k_clip: float, v_clip: float, sm_scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Append a chunk of ``qo_indptr[b+1] - qo_indptr[b]`` tokens per sequence and
    attend with the chunk's queries (``q [nnz, Hq, D]``, K/V ``[nnz, H, D]``).

    The page table covers the chunk (lengths after the append). Query ``i`` of
    sequence ``b`` sits at position ``seq_len - chunk_len + i`` and follows
    :func:`window_rule_attention`; so chunked prefill equals token-by-token decode.
    Order: INT2 pages and sink rows of the chunk are written, attention reads the
    recent ring as it was before the chunk (plus the chunk's own BF16 rows from the
    inputs), then the ring is updated.
    """
    spec = cache.spec
    s, w = spec.sink_size, spec.recent_size
    seq_lens = seq_lens_from_page_table(kv_indptr, kv_last_page_len, spec.page_size)
    qo = qo_indptr.long()
    chunk = qo[1:] - qo[:-1]
    batch_indices = torch.repeat_interleave(torch.arange(len(chunk), device=q.device), chunk)
    positions = (torch.arange(q.shape[0], device=q.device) - qo[batch_indices]
                 + (seq_lens - chunk)[batch_indices])
    args = (batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, window_slots,
            rot_k, rot_v, k_clip, v_clip)
    append_paged_kv(cache, append_key, append_value, *args, write_pages=True, write_recent=False)
    q_rot = rotate_queries(q, rot_k)
    k_new = rotate(append_key, rot_k).to(cache.k_window.dtype).to(torch.float32)
    v_new = rotate(append_value, rot_v).to(cache.v_window.dtype).to(torch.float32)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(len(chunk)):
        n, length = int(chunk[b]), int(seq_lens[b])
        if n == 0:
            continue
        prefix = length - n
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])]
        k_int2, v_int2 = gather_int2(cache, pages, length)
        k_full, v_full = k_int2.clone(), v_int2.clone()
        pos = torch.arange(length, device=q.device)
        old = (pos < prefix) & ((pos < s) | (pos >= prefix - w))
        if bool(old.any()):
            kw, vw = gather_window(cache, int(window_slots[b]), pos[old])
            k_full[old] = kw
            v_full[old] = vw
        k_full[prefix:] = k_new[qo[b]:qo[b + 1]]
        v_full[prefix:] = v_new[qo[b]:qo[b + 1]]
        o_b, lse_b = window_rule_attention(q_rot[qo[b]:qo[b + 1]], pos[prefix:],
                                           k_int2, v_int2, k_full, v_full, s, w, sm_scale)
        out[qo[b]:qo[b + 1]] = o_b
        lse[qo[b]:qo[b + 1]] = lse_b
    append_paged_kv(cache, append_key, append_value, *args, write_pages=False, write_recent=True)
    return unrotate_output(out, rot_v), lse
