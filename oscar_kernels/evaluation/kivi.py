"""KIVI-2 baseline (Liu et al., 2024), emulated for teacher-forced scoring.

KIVI quantizes the post-RoPE cache without rotation, asymmetric 2-bit min/max (no
clipping), with scales and zeros stored in fp16:

* **keys per channel**: each channel of each KV head is quantized over blocks of
  ``group_size`` (32) consecutive tokens, block ``[32 i, 32 i + 32)``;
* **values per token**: each token's channels in groups of ``group_size`` (32);
* a **full-precision residual** of ``residual_length`` (128) tokens. Keys stay full
  precision until ``residual_length`` of them have accumulated and are then quantized
  together, so the query at position ``t`` reads keys ``p >= R * floor(t / R)`` in full
  precision (1..R of them); values are quantized one token at a time as they leave a
  sliding residual, so the query at ``t`` reads values ``p >= t - R`` in full precision.
  These are the reads of KIVI's token-by-token decoding (its reference implementation
  attends before flushing the residual); here every query of a teacher-forced pass
  follows them, the way :mod:`oscar_kernels.integrations.transformers` applies the OSCAR
  read rule to every query. Full-precision rows are stored in fp16, as KIVI does.

Memory: the INT2 region costs ``2 + 2 * 16 / group_size`` bits per element for keys and
for values (3.0 with ``group_size = 32``), see :func:`kivi_bits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import expect
from ..reference.quant import dequantize_groups, quantize_groups

DEFAULT_GROUP_SIZE = 32
DEFAULT_RESIDUAL_LENGTH = 128


def kivi_quantize_keys(k: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE,
                       scale_dtype: torch.dtype = torch.float16
                       ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-channel quantization of keys over blocks of ``group_size`` tokens.

    Parameters
    ----------
    k : Tensor ``[L, H, D]`` float32
        Post-RoPE keys of one sequence.

    Returns
    -------
    k_hat : Tensor ``[L, H, D]`` float32
        Dequantized keys for the first ``n_quant = group_size * floor(L / group_size)``
        rows; the rows of the trailing partial block are copies of ``k`` (KIVI never
        reads them quantized).
    scale : Tensor ``[L // group_size, H, D]`` of ``scale_dtype``
        Per-block, per-channel scale (the zero has the same shape and is not returned).
    n_quant : int
    """
    expect(k.dim() == 3 and k.dtype == torch.float32, "k", "a float32 tensor [L, H, D]", k,
           TypeError if k.dtype != torch.float32 else ValueError)
    expect(isinstance(group_size, int) and group_size >= 1, "group_size", "a positive int",
           group_size)
    length, h, d = k.shape
    nb = length // group_size
    n = nb * group_size
    out = k.clone()
    if nb == 0:
        return out, torch.empty(0, h, d, dtype=scale_dtype, device=k.device), 0
    blocks = k[:n].reshape(nb, group_size, h, d).permute(0, 2, 3, 1)      # [nb, H, D, G]
    codes, scale, zero = quantize_groups(blocks.contiguous(), group_size, 1.0, scale_dtype)
    deq = dequantize_groups(codes, scale, zero, group_size)               # [nb, H, D, G]
    out[:n] = deq.permute(0, 3, 1, 2).reshape(n, h, d)
    return out, scale[..., 0], n


def kivi_quantize_values(v: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE,
                         scale_dtype: torch.dtype = torch.float16
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token quantization of values in groups of ``min(group_size, D)`` channels.

    ``v [L, H, D]`` float32 → dequantized ``v_hat [L, H, D]`` and ``scale [L, H, D / G]``.
    """
    expect(v.dim() == 3 and v.dtype == torch.float32, "v", "a float32 tensor [L, H, D]", v,
           TypeError if v.dtype != torch.float32 else ValueError)
    g = min(group_size, v.shape[-1])
    expect(v.shape[-1] % g == 0, "group_size", f"a divisor of head_dim={v.shape[-1]}",
           group_size)
    codes, scale, zero = quantize_groups(v, g, 1.0, scale_dtype)
    return dequantize_groups(codes, scale, zero, g), scale


def kivi_full_masks(q_positions: torch.Tensor, length: int,
                    residual_length: int = DEFAULT_RESIDUAL_LENGTH
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Boolean ``[Nq, length]`` masks: visible (``p <= t``), keys read in full precision
    (``R * floor(t / R) <= p <= t``), values read in full precision (``t - R <= p <= t``)."""
    t = q_positions.to(torch.int64)[:, None]
    p = torch.arange(length, device=q_positions.device)[None, :]
    visible = p <= t
    r = residual_length
    k_full = (p >= (t // r) * r) & visible
    v_full = (p >= t - r) & visible
    return visible, k_full, v_full


def kivi_bits(seq_len: int | None = None, *, group_size: int = DEFAULT_GROUP_SIZE,
              residual_length: int = DEFAULT_RESIDUAL_LENGTH, scale_bits: int = 16,
              full_bits: int = 16) -> float:
    """Bits per K/V element: the INT2 region alone (``seq_len=None``), or a whole cache of
    ``seq_len`` tokens with KIVI's residual (keys: ``R * floor(L / R)`` quantized, values:
    ``L - R``), scales and zeros included."""
    int2 = 2.0 + 2.0 * scale_bits / group_size
    if seq_len is None:
        return int2
    expect(isinstance(seq_len, int) and seq_len > 0, "seq_len", "a positive int", seq_len)
    qk = (seq_len // residual_length) * residual_length
    qv = max(0, seq_len - residual_length)
    total = (qk + qv) * int2 + (2 * seq_len - qk - qv) * full_bits
    return total / (2 * seq_len)


@dataclass
class KiviLayerRule:
    """KIVI-2 read rule of one layer, an ``EmulationRule`` for
    :func:`oscar_kernels.integrations.transformers.attach_scheme`."""

    group_size: int = DEFAULT_GROUP_SIZE
    residual_length: int = DEFAULT_RESIDUAL_LENGTH
    scale_dtype: torch.dtype = torch.float16
    full_dtype: torch.dtype = torch.float16
    query_chunk: int = 256

    def __post_init__(self) -> None:
        expect(isinstance(self.residual_length, int) and self.residual_length > 0
               and self.residual_length % self.group_size == 0, "residual_length",
               f"a positive multiple of group_size={self.group_size}", self.residual_length)

    def emulate(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_positions: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """``q [Nq, Hq, D]``, ``k/v [L, H, D]`` float32 → ``o [Nq, Hq, D]`` float32."""
        nq, hq, d = q.shape
        length, h, _ = k.shape
        g = hq // h
        k_hat, _, _ = kivi_quantize_keys(k, self.group_size, self.scale_dtype)
        v_hat, _ = kivi_quantize_values(v, self.group_size, self.scale_dtype)
        k_res = k.to(self.full_dtype).to(torch.float32)
        v_res = v.to(self.full_dtype).to(torch.float32)
        kt_hat = k_hat.permute(1, 2, 0).contiguous()                      # [H, D, L]
        kt_res = k_res.permute(1, 2, 0).contiguous()
        vh_hat = v_hat.permute(1, 0, 2).contiguous()                      # [H, L, D]
        dv = (v_res - v_hat).permute(1, 0, 2).contiguous()
        out = torch.empty(nq, hq, d, dtype=torch.float32, device=q.device)
        for a in range(0, nq, self.query_chunk):
            b = min(a + self.query_chunk, nq)
            t = q_positions[a:b]
            n = int(t.max()) + 1
            c = b - a
            visible, k_full, v_full = kivi_full_masks(t, n, self.residual_length)
            qh = (q[a:b] * sm_scale).reshape(c, h, g, d).permute(1, 2, 0, 3).reshape(h, g * c, d)
            s = torch.where(k_full, torch.bmm(qh, kt_res[:, :, :n]).view(h, g, c, n),
                            torch.bmm(qh, kt_hat[:, :, :n]).view(h, g, c, n))
            p = torch.softmax(s.masked_fill_(~visible, float("-inf")), dim=-1)
            o = torch.bmm(p.view(h, g * c, n), vh_hat[:, :n]) \
                + torch.bmm((p * v_full).view(h, g * c, n), dv[:, :n])
            out[a:b] = o.view(h, g, c, d).permute(2, 0, 1, 3).reshape(c, hq, d)
        return out


def kivi_rules(num_layers: int, **kwargs) -> list[KiviLayerRule]:
    """One :class:`KiviLayerRule` per layer (same settings)."""
    return [KiviLayerRule(**kwargs) for _ in range(num_layers)]
