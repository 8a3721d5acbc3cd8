"""Tensor-parallel sharding of the INT2 cache: which KV heads a rank holds, and their rotations.

Attention is independent per KV head, so tensor parallelism splits the KV heads (and
their query heads) across ranks, each rank keeping an ordinary
:class:`~oscar_kernels.cache.Int2PagedKVCache` of its own heads. The rule follows
SGLang/vLLM: with ``tp_size <= num_kv_heads`` rank ``r`` holds the contiguous heads
``[r * H / tp, (r + 1) * H / tp)``; with ``tp_size > num_kv_heads`` every KV head is
replicated on ``tp_size / H`` consecutive ranks, so rank ``r`` holds head
``r * H // tp_size``. Per-head rotations (``Hr == num_kv_heads``) follow their heads
(``rot[h0:h1]``); a shared rotation (``Hr == 1``) is kept as is. Clip ratios are per layer
and unchanged.
"""

from __future__ import annotations

from ..errors import expect
from ..rotation import LayerRotation


def kv_head_range(tp_rank: int, tp_size: int, num_kv_heads: int) -> tuple[int, int]:
    """Global KV-head range ``[h0, h1)`` held by ``tp_rank`` of ``tp_size``.

    Parameters
    ----------
    tp_rank, tp_size : int
        ``0 <= tp_rank < tp_size``.
    num_kv_heads : int
        KV heads of the whole model layer. Either ``tp_size`` divides it, or it divides
        ``tp_size`` (replication), as in SGLang.

    Example
    -------
    >>> kv_head_range(1, 2, 8), kv_head_range(5, 8, 4)
    ((4, 8), (2, 3))
    """
    expect(isinstance(tp_size, int) and tp_size >= 1, "tp_size", "a positive int", tp_size)
    expect(isinstance(tp_rank, int) and 0 <= tp_rank < tp_size, "tp_rank",
           f"an int in [0, {tp_size})", tp_rank)
    expect(isinstance(num_kv_heads, int) and num_kv_heads >= 1, "num_kv_heads", "a positive int",
           num_kv_heads)
    if tp_size <= num_kv_heads:
        expect(num_kv_heads % tp_size == 0, "tp_size",
               f"a divisor of num_kv_heads={num_kv_heads}", tp_size)
        per = num_kv_heads // tp_size
        return tp_rank * per, (tp_rank + 1) * per
    expect(tp_size % num_kv_heads == 0, "tp_size",
           f"a multiple of num_kv_heads={num_kv_heads} when larger than it", tp_size)
    h = tp_rank * num_kv_heads // tp_size
    return h, h + 1


def qo_head_range(tp_rank: int, tp_size: int, num_qo_heads: int) -> tuple[int, int]:
    """Global query-head range ``[q0, q1)`` of ``tp_rank`` (``tp_size`` divides ``num_qo_heads``)."""
    expect(isinstance(num_qo_heads, int) and num_qo_heads % tp_size == 0, "num_qo_heads",
           f"a multiple of tp_size={tp_size}", num_qo_heads)
    per = num_qo_heads // tp_size
    return tp_rank * per, (tp_rank + 1) * per


def shard_rotation(rotation: LayerRotation, h0: int, h1: int, num_kv_heads: int
                   ) -> LayerRotation:
    """The rotation of KV heads ``[h0, h1)`` of a layer with ``num_kv_heads`` heads.

    Per-head rotations ``[num_kv_heads, D, D]`` are sliced to ``[h1 - h0, D, D]`` (a
    contiguous copy); a shared ``[1, D, D]`` rotation is returned unchanged.

    Example
    -------
    >>> import torch
    >>> r = LayerRotation(torch.eye(16).repeat(4, 1, 1), torch.eye(16).repeat(4, 1, 1))
    >>> tuple(shard_rotation(r, 2, 4, 4).rot_k.shape)
    (2, 16, 16)
    """
    expect(isinstance(rotation, LayerRotation), "rotation", "a LayerRotation", rotation,
           TypeError)
    expect(0 <= h0 < h1 <= num_kv_heads, "h0, h1", f"0 <= h0 < h1 <= {num_kv_heads}", (h0, h1))
    hr = rotation.rot_k.shape[0]
    expect(hr in (1, num_kv_heads), "rotation.rot_k", f"[1 or {num_kv_heads}, D, D]",
           rotation.rot_k)
    if hr == 1:
        return rotation
    cut = lambda t: None if t is None else t[h0:h1].contiguous()  # noqa: E731
    return LayerRotation(cut(rotation.rot_k), cut(rotation.rot_v), rotation.k_clip,
                         rotation.v_clip, cut(rotation.k_eigenvalues),
                         cut(rotation.v_eigenvalues))
