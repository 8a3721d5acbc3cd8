"""Clip, quantize, pack, unpack and dequantize: the INT2 format of docs/format.md.

Everything is float32 on the CPU (or any device), element for element the rule the
kernels implement. Shapes: ``x`` is ``[..., head_dim]``; groups are contiguous runs of
``group_size`` channels along the last dimension.
"""

from __future__ import annotations

import math

import torch

from ..errors import expect
from ..spec import CODES_PER_BYTE, NUM_LEVELS

FP16_MAX = 65504.0


def clip_index(ratio: float, group_size: int) -> int:
    """Index into the ascending sort of ``|x|`` of a group that gives the clip threshold.

    ``min(group_size - 1, floor(ratio * group_size))`` with ``ratio`` a Python float
    (double precision). ``ratio >= 1`` means no clipping (the largest magnitude).
    """
    expect(isinstance(ratio, (int, float)) and 0.0 < ratio <= 1.0 and math.isfinite(ratio),
           "clip ratio", "a float in (0, 1]", ratio)
    return min(group_size - 1, int(math.floor(float(ratio) * group_size)))


def clip_groups(x: torch.Tensor, group_size: int, ratio: float) -> torch.Tensor:
    """Clip each group to ``[-tau, tau]``, ``tau = sort(|x_g|)[clip_index(ratio, G)]``."""
    g = x.reshape(*x.shape[:-1], -1, group_size)
    k = clip_index(ratio, group_size)
    if k == group_size - 1:
        return x.clone()
    tau = torch.kthvalue(g.abs(), k + 1, dim=-1, keepdim=True).values
    return torch.maximum(torch.minimum(g, tau), -tau).reshape(x.shape)


def _to_storage(t: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    if scale_dtype == torch.float16:
        t = t.clamp(-FP16_MAX, FP16_MAX)
    return t.to(scale_dtype)


def quantize_groups(x: torch.Tensor, group_size: int, ratio: float = 1.0,
                    scale_dtype: torch.dtype = torch.float16
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 2-bit quantization of ``x [..., D]`` (float32) per group.

    Returns ``codes [..., D]`` uint8 in ``0..3`` (unpacked), ``scale`` and ``zero``
    ``[..., D // group_size]`` in ``scale_dtype``. The rule, per group:

    1. ``xc = clamp(x, -tau, tau)`` (see :func:`clip_groups`);
    2. ``scale = store((max(xc) - min(xc)) / 3)``, ``zero = store(min(xc))`` where
       ``store`` saturates to the dtype's finite range and rounds to nearest;
    3. ``code = clamp(floor((xc - zero) / scale + 0.5), 0, 3)`` with the *stored*
       scale and zero upcast to float32 (IEEE division); ``code = 0`` when the stored
       scale is 0 (constant group: dequantizes exactly to ``zero``);
    4. a group holding a NaN or Inf gets ``scale = zero = NaN`` and codes 0. Groups,
       heads and tokens are independent, so no other group is affected.
    """
    expect(x.dtype == torch.float32, "x", "float32", x, TypeError)
    d = x.shape[-1]
    expect(d % group_size == 0, "group_size", f"a divisor of head_dim={d}", group_size)
    finite = torch.isfinite(x).reshape(*x.shape[:-1], -1, group_size).all(dim=-1, keepdim=True)
    x = torch.where(finite, x.reshape(finite.shape[:-1] + (group_size,)), 0.0).reshape(x.shape)
    xc = clip_groups(x, group_size, ratio).reshape(*x.shape[:-1], -1, group_size)
    mn = xc.amin(dim=-1, keepdim=True)
    mx = xc.amax(dim=-1, keepdim=True)
    scale_s = _to_storage((mx - mn) / (NUM_LEVELS - 1), scale_dtype)
    zero_s = _to_storage(mn, scale_dtype)
    scale_f = scale_s.to(torch.float32)
    zero_f = zero_s.to(torch.float32)
    safe = torch.where(scale_f > 0, scale_f, torch.ones_like(scale_f))
    t = torch.floor((xc - zero_f) / safe + 0.5).clamp(0, NUM_LEVELS - 1)
    t = torch.where(scale_f > 0, t, torch.zeros_like(t))
    t = torch.where(finite, t, torch.zeros_like(t))
    nan = torch.full_like(scale_s, float("nan"))
    scale_s = torch.where(finite, scale_s, nan).squeeze(-1)
    zero_s = torch.where(finite, zero_s, nan).squeeze(-1)
    return t.to(torch.uint8).reshape(x.shape), scale_s, zero_s


def dequantize_groups(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    """``zero_g + scale_g * code`` in float32; ``codes [..., D]`` unpacked uint8."""
    c = codes.to(torch.float32).reshape(*codes.shape[:-1], -1, group_size)
    out = zero.to(torch.float32)[..., None] + scale.to(torch.float32)[..., None] * c
    return out.reshape(codes.shape)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Pack ``codes [..., D]`` (values 0..3) into ``[..., D // 4]`` uint8.

    Byte ``j`` holds channel ``j + i * D / 4`` in bits ``[2 i, 2 i + 2)`` for
    ``i = 0..3``: unpacking a row gives four contiguous quarter-vectors.
    """
    expect(codes.dtype == torch.uint8, "codes", "uint8", codes, TypeError)
    d = codes.shape[-1]
    expect(d % CODES_PER_BYTE == 0, "codes", "a last dimension divisible by 4", codes)
    q = codes.reshape(*codes.shape[:-1], CODES_PER_BYTE, d // CODES_PER_BYTE).to(torch.int32)
    packed = q[..., 0, :] | (q[..., 1, :] << 2) | (q[..., 2, :] << 4) | (q[..., 3, :] << 6)
    return packed.to(torch.uint8)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``[..., D // 4]`` uint8 → ``[..., D]`` uint8."""
    expect(packed.dtype == torch.uint8, "packed", "uint8", packed, TypeError)
    p = packed.to(torch.int32)
    parts = [(p >> (2 * i)) & 3 for i in range(CODES_PER_BYTE)]
    return torch.cat(parts, dim=-1).to(torch.uint8)
