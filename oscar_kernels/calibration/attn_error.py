"""Attention-output error of a rotation + clip choice on real held-out Q/K/V; clip search.

The quantized attention is exactly the cache's read rule
(:func:`oscar_kernels.reference.paged.window_rule_attention`): keys and values are
rotated, positions in the sink (``p < sink_size``) and recent window
(``p > t - recent_size``) are read in BF16, every other position through the reference
INT2 quantizer (:func:`oscar_kernels.reference.quant.quantize_groups`, fp16 scale/zero);
queries are rotated by ``R_K`` and the output is un-rotated by ``R_Vᵀ``. The reference is
plain float32 causal attention on the un-quantized tensors.

The error of a layer is ``||O - O_ref||_F / ||O_ref||_F`` over the sampled queries and
all query heads of all held-out sequences (a relative Frobenius error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import expect
from ..reference.paged import rotate, rotate_queries, unrotate_output, window_rule_attention
from ..reference.quant import dequantize_groups, quantize_groups
from ..spec import DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE
from .stats import HeldoutSequence

#: Clip grid of ``--clip search``: 0.80, 0.82, ..., 1.00.
CLIP_GRID = tuple(round(0.80 + 0.02 * i, 2) for i in range(11))


@dataclass(frozen=True)
class QuantRule:
    """Group size and window sizes of the simulated cache (docs/format.md)."""

    group_size: int | None = None
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    scale_dtype: torch.dtype = torch.float16

    def group(self, head_dim: int) -> int:
        return head_dim if self.group_size is None else self.group_size


def reference_attention(seq: HeldoutSequence) -> torch.Tensor:
    """Float32 causal attention of the sampled queries, ``[Nq, Hq, D]``."""
    h = seq.k.shape[1]
    g = seq.q.shape[1] // h
    k = seq.k.repeat_interleave(g, dim=1)
    v = seq.v.repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,lhd->qhl", seq.q, k) * seq.scaling
    pos = torch.arange(seq.k.shape[0])
    mask = pos[None, :] > seq.q_positions[:, None]
    probs = torch.softmax(scores.masked_fill(mask[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("qhl,lhd->qhd", probs, v)


def fake_quantize(x_rot: torch.Tensor, group_size: int, ratio: float,
                  scale_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """``x_rot [..., D]`` through the reference INT2 quantizer and back (float32)."""
    codes, scale, zero = quantize_groups(x_rot.contiguous(), group_size, ratio, scale_dtype)
    return dequantize_groups(codes, scale, zero, group_size)


def _as_heads(rot: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    return rot.expand(num_kv_heads, -1, -1) if rot.shape[0] == 1 else rot


class LayerEvaluator:
    """Errors of one layer's held-out sequences under many (rotation, clip) choices.

    Caches the reference outputs; K and V are quantized once per (rotation, clip).

    Parameters
    ----------
    sequences : sequence of HeldoutSequence
        Real post-RoPE tensors of this layer.
    rule : QuantRule
    """

    def __init__(self, sequences: Sequence[HeldoutSequence], rule: QuantRule):
        expect(len(sequences) > 0, "sequences", "at least one held-out sequence", 0)
        self.sequences = list(sequences)
        self.rule = rule
        self.refs = [reference_attention(s) for s in self.sequences]
        self.ref_sq = sum(float((r * r).sum()) for r in self.refs)

    def _prepare(self, rot_k: torch.Tensor, rot_v: torch.Tensor) -> list[dict]:
        # rotated tensors of the last rotation pair, and fake-quantized ones per clip
        last = getattr(self, "_rotations", (None, None))
        if last[0] is not rot_k or last[1] is not rot_v:
            self._rotations = (rot_k, rot_v)   # held, so identity comparison stays valid
            self._prepared = []
            for seq in self.sequences:
                h = seq.k.shape[1]
                rk, rv = _as_heads(rot_k, h), _as_heads(rot_v, h)
                k_rot, v_rot = rotate(seq.k, rk), rotate(seq.v, rv)
                self._prepared.append({
                    "rk": rk, "rv": rv, "q_rot": rotate_queries(seq.q, rk),
                    "k": k_rot, "v": v_rot,
                    "k_full": k_rot.to(torch.bfloat16).to(torch.float32),
                    "v_full": v_rot.to(torch.bfloat16).to(torch.float32)})
        return self._prepared

    def _quantized(self, prep: dict, name: str, clip: float | None, head_dim: int
                   ) -> torch.Tensor:
        if clip is None:
            return prep[name]
        slot = (name, float(clip))
        if slot not in prep:
            prep[slot] = fake_quantize(prep[name], self.rule.group(head_dim), clip,
                                       self.rule.scale_dtype)
        return prep[slot]

    def error(self, rot_k: torch.Tensor, rot_v: torch.Tensor, k_clip: float | None,
              v_clip: float | None) -> float:
        """Relative Frobenius error of the attention output.

        ``rot_k, rot_v [Hr, D, D]``; a clip of ``None`` leaves that tensor un-quantized
        (used to search K and V separately).
        """
        num = 0.0
        for seq, ref, prep in zip(self.sequences, self.refs, self._prepare(rot_k, rot_v)):
            d = seq.k.shape[-1]
            k_q = self._quantized(prep, "k", k_clip, d)
            v_q = self._quantized(prep, "v", v_clip, d)
            o_rot, _ = window_rule_attention(prep["q_rot"], seq.q_positions, k_q, v_q,
                                             prep["k_full"], prep["v_full"],
                                             self.rule.sink_size, self.rule.recent_size,
                                             seq.scaling)
            o = unrotate_output(o_rot, prep["rv"])
            num += float(((o - ref) ** 2).sum())
        return (num / max(self.ref_sq, 1e-300)) ** 0.5

    def search_clip(self, rot_k: torch.Tensor, rot_v: torch.Tensor,
                    grid: Sequence[float] = CLIP_GRID) -> tuple[float, float]:
        """Per-layer clip ratios minimizing the error: ``k_clip`` with V un-quantized,
        then ``v_clip`` with K quantized at the chosen ``k_clip``.

        Each 1-D search evaluates every other grid point, then the unevaluated neighbours
        of the best one (the error is close to unimodal in the ratio; this finds the grid
        minimum in about 2/3 of the evaluations). Ties go to the larger ratio.
        """
        k_best = _grid_min(lambda c: self.error(rot_k, rot_v, c, None), grid)
        v_best = _grid_min(lambda c: self.error(rot_k, rot_v, k_best, c), grid)
        return k_best, v_best


def _grid_min(f, grid: Sequence[float]) -> float:
    pts = sorted(set(float(c) for c in grid), reverse=True)       # 1.00 first
    seen: dict[int, float] = {}
    for i in range(0, len(pts), 2):
        seen[i] = f(pts[i])
    if (len(pts) - 1) not in seen:
        seen[len(pts) - 1] = f(pts[-1])
    best = min(seen, key=lambda i: (seen[i], i))
    for j in (best - 1, best + 1):
        if 0 <= j < len(pts) and j not in seen:
            seen[j] = f(pts[j])
    best = min(seen, key=lambda i: (seen[i], i))
    return pts[best]


def sample_query_positions(seq_len: int, num_queries: int, min_position: int) -> torch.Tensor:
    """``num_queries`` positions spread evenly over ``[min_position, seq_len - 1]``
    (fewer when the range is shorter), int64."""
    lo = min(max(0, min_position), seq_len - 1)
    n = max(1, min(num_queries, seq_len - lo))
    return torch.linspace(lo, seq_len - 1, n).round().to(torch.int64).unique()
