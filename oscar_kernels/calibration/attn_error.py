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
from ..reference.quant import _to_storage, clip_index, dequantize_groups, quantize_groups
from ..spec import DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE, NUM_LEVELS
from .stats import HeldoutSequence

#: Clip grid of ``--clip search``: 0.80, 0.82, ..., 1.00.
CLIP_GRID = tuple(round(0.80 + 0.02 * i, 2) for i in range(11))


def clip_grid(lowest: float, step: float = 0.02) -> tuple[float, ...]:
    """Search grid ``lowest, lowest + step, ..., 1.00`` (``(1.0,)`` when ``lowest == 1``).

    Raises
    ------
    ValueError
        ``lowest`` outside ``(0, 1]`` or ``step`` not positive.
    """
    expect(isinstance(lowest, (int, float)) and 0.0 < float(lowest) <= 1.0, "lowest",
           "a ratio in (0, 1]", lowest)
    expect(isinstance(step, (int, float)) and step > 0, "step", "a positive float", step)
    n = int(round((1.0 - float(lowest)) / step + 1e-9))
    pts = {round(1.0 - step * i, 4) for i in range(n + 1)} | {round(float(lowest), 4)}
    return tuple(sorted(p for p in pts if float(lowest) - 1e-9 <= p <= 1.0))


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


class GroupFakeQuantizer:
    """:func:`fake_quantize` of one finite tensor at many clip ratios.

    The per-group sort of ``|x|`` is done once; each ratio then costs a handful of
    elementwise ops. Bit-identical to the reference quantizer for finite inputs
    (checked in test_calib_artifact).
    """

    def __init__(self, x_rot: torch.Tensor, group_size: int,
                 scale_dtype: torch.dtype = torch.float16):
        expect(x_rot.dtype == torch.float32, "x_rot", "float32", x_rot, TypeError)
        expect(bool(torch.isfinite(x_rot).all()), "x_rot", "finite values", "NaN or Inf")
        self.shape = x_rot.shape
        self.group_size = group_size
        self.scale_dtype = scale_dtype
        self.g = x_rot.reshape(*x_rot.shape[:-1], -1, group_size)
        self.sorted_abs = self.g.abs().sort(dim=-1).values

    def __call__(self, ratio: float) -> torch.Tensor:
        k = clip_index(ratio, self.group_size)
        if k == self.group_size - 1:
            xc = self.g
        else:
            tau = self.sorted_abs[..., k:k + 1]
            xc = torch.maximum(torch.minimum(self.g, tau), -tau)
        mn = xc.amin(dim=-1, keepdim=True)
        mx = xc.amax(dim=-1, keepdim=True)
        scale_s = _to_storage((mx - mn) / (NUM_LEVELS - 1), self.scale_dtype)
        zero_s = _to_storage(mn, self.scale_dtype)
        scale_f = scale_s.to(torch.float32)
        zero_f = zero_s.to(torch.float32)
        pos = scale_f > 0
        safe = torch.where(pos, scale_f, torch.ones_like(scale_f))
        t = torch.floor((xc - zero_f) / safe + 0.5).clamp(0, NUM_LEVELS - 1)
        t = torch.where(pos, t, torch.zeros_like(t))
        return (zero_f + scale_f * t).reshape(self.shape)


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
            fq = prep.get(("fq", name))
            if fq is None:
                fq = prep[("fq", name)] = GroupFakeQuantizer(
                    prep[name], self.rule.group(head_dim), self.rule.scale_dtype)
            prep[slot] = fq(clip)
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

    # ------------------------------------------------------------ fast clip search
    # The same rule as window_rule_attention, organized so one clip change costs one
    # einsum: scores of the BF16 keys, the masks and the reference in rotated space are
    # computed once per rotation; during the V search the probabilities are fixed.
    # test_calib_artifact checks these errors equal :meth:`error`.
    def _search_state(self, rot_k, rot_v) -> list[dict]:
        preps = self._prepare(rot_k, rot_v)
        for seq, ref, prep in zip(self.sequences, self.refs, preps):
            if "s_full" in prep:
                continue
            nq, hq, d = seq.q.shape
            h = seq.k.shape[1]
            g = hq // h
            t = seq.q_positions.long()[:, None]
            pos = torch.arange(seq.k.shape[0])[None, :]
            prep["qg"] = prep["q_rot"].reshape(nq, h, g, d)
            prep["full"] = ((pos < self.rule.sink_size)
                            | (pos > t - self.rule.recent_size))[:, None, None, :]
            prep["hidden"] = (pos > t)[:, None, None, :]
            prep["s_full"] = torch.einsum("qhgd,lhd->qhgl", prep["qg"], prep["k_full"])
            ref_rot = torch.einsum("qhgd,hde->qhge", ref.reshape(nq, h, g, d), prep["rv"])
            prep["ref_rot"] = ref_rot
        return preps

    def _probs(self, seq, prep, k_clip):
        k_q = self._quantized(prep, "k", k_clip, seq.k.shape[-1])
        s_int2 = torch.einsum("qhgd,lhd->qhgl", prep["qg"], k_q)
        scores = torch.where(prep["full"], prep["s_full"], s_int2) * seq.scaling
        return torch.softmax(scores.masked_fill(prep["hidden"], float("-inf")), dim=-1)

    def _k_search_error(self, rot_k, rot_v, k_clip: float) -> float:
        num = 0.0
        for seq, prep in zip(self.sequences, self._search_state(rot_k, rot_v)):
            p = self._probs(seq, prep, k_clip)
            full = prep["full"].to(p.dtype)
            o = (torch.einsum("qhgl,lhd->qhgd", p * full, prep["v_full"])
                 + torch.einsum("qhgl,lhd->qhgd", p * (1 - full), prep["v"]))
            num += float(((o - prep["ref_rot"]) ** 2).sum())
        return (num / max(self.ref_sq, 1e-300)) ** 0.5

    def _v_search_errors(self, rot_k, rot_v, k_clip: float, grid: Sequence[float]
                         ) -> dict[float, float]:
        nums = {float(c): 0.0 for c in grid}
        for seq, prep in zip(self.sequences, self._search_state(rot_k, rot_v)):
            p = self._probs(seq, prep, k_clip)
            full = prep["full"].to(p.dtype)
            o_full = torch.einsum("qhgl,lhd->qhgd", p * full, prep["v_full"])
            p_int2 = p * (1 - full)
            for c in nums:
                v_q = self._quantized(prep, "v", c, seq.k.shape[-1])
                o = o_full + torch.einsum("qhgl,lhd->qhgd", p_int2, v_q)
                nums[c] += float(((o - prep["ref_rot"]) ** 2).sum())
        return {c: (n / max(self.ref_sq, 1e-300)) ** 0.5 for c, n in nums.items()}

    def search_clip(self, rot_k: torch.Tensor, rot_v: torch.Tensor,
                    grid: Sequence[float] = CLIP_GRID) -> tuple[float, float]:
        """Per-layer clip ratios minimizing the error: ``k_clip`` with V un-quantized
        (the INT2 region reads the exact rotated values), then ``v_clip`` with K quantized
        at the chosen ``k_clip``.

        The K search evaluates every other grid point, then the unevaluated neighbours of
        the best one (the error is close to unimodal in the ratio); the V search, one
        einsum per ratio, evaluates the whole grid. Ties go to the larger ratio.
        """
        k_best, v_best, _, _ = self.search_clip_with_errors(rot_k, rot_v, grid)
        return k_best, v_best

    def search_clip_with_errors(self, rot_k: torch.Tensor, rot_v: torch.Tensor,
                                grid: Sequence[float] = CLIP_GRID,
                                v_grid: Sequence[float] | None = None
                                ) -> tuple[float, float, float, float]:
        """:meth:`search_clip` plus the minimized errors: ``(k_clip, v_clip, k_error,
        v_error)``; ``k_error`` is with V un-quantized, ``v_error`` with both quantized.
        ``grid`` is searched for K, ``v_grid`` (default ``grid``) for V."""
        k_err: dict[float, float] = {}

        def fk(c):
            k_err[c] = self._k_search_error(rot_k, rot_v, c)
            return k_err[c]

        k_best = _grid_min(fk, grid)
        v_err = self._v_search_errors(rot_k, rot_v, k_best, grid if v_grid is None else v_grid)
        v_best = min(v_err, key=lambda c: (v_err[c], -c))
        return k_best, v_best, k_err[k_best], v_err[v_best]


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
