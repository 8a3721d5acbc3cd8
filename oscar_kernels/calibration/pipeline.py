"""The calibration pipeline: stream statistics, keep small held-out buffers, fit, search
clips, measure.

1. :func:`collect_statistics` runs the model over ``--tokens`` calibration tokens in
   fixed-length chunks and feeds every layer's post-RoPE Q/K/V and attention output to a
   :class:`~oscar_kernels.calibration.stats.LayerStats` (float64 running sums: memory
   is flat in the number of tokens).
2. :func:`collect_heldout` runs a bounded number of fixed-length sequences and keeps, per
   layer, all keys/values and a fixed sample of queries (positions >= 512 by default,
   where the INT2 region of the cache dominates). One buffer comes from calibration text
   that the statistics did not see (for ``--clip search``), one from held-out text (for
   the report).
3. :func:`fit_all` fits every method's artifact, :func:`evaluate_all` searches per-layer
   clips and measures every (method, clip policy) on the held-out text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..errors import expect
from ..rotation import LayerRotation, RotationArtifact
from ..spec import DEFAULT_K_CLIP, DEFAULT_V_CLIP
from .attn_error import CLIP_GRID, LayerEvaluator, QuantRule, sample_query_positions
from .capture import AttentionGeometry, capture_attention
from .data import iter_chunks
from .fit import fit_artifact
from .stats import HeldoutSequence, LayerStats

log = logging.getLogger(__name__)

#: Clip policies of the report: published fixed ratios, per-layer search, no clipping.
CLIP_POLICIES = ("none", "fixed", "search")


@dataclass(frozen=True)
class Variant:
    """One rotation recipe: a method plus per-head or per-layer targets."""

    method: str
    per_head: bool = False

    @property
    def name(self) -> str:
        return self.method + ("/head" if self.per_head else "")


def default_variants(num_kv_heads: int, *, per_head: bool = True,
                     which: str = "core") -> list[Variant]:
    """Variants measured by the report.

    ``"core"``: identity, hadamard, kv-cov and oscar (fitted ones per KV head when
    ``per_head`` and the model has more than one KV head). ``"all"``: identity, hadamard
    and kv-cov / oscar / oscar-proxy both per layer and (with several KV heads) per head.
    """
    expect(which in ("core", "all"), "which", "'core' or 'all'", which)
    ph = per_head and num_kv_heads > 1
    if which == "core":
        return [Variant("identity"), Variant("hadamard"), Variant("kv-cov", ph),
                Variant("oscar", ph)]
    out = [Variant("identity"), Variant("hadamard"), Variant("kv-cov"), Variant("oscar"),
           Variant("oscar-proxy")]
    if num_kv_heads > 1:
        out += [Variant("kv-cov", True), Variant("oscar", True), Variant("oscar-proxy", True)]
    return out


def _backbone(model):
    """The decoder without the LM head (logits are not needed to capture attention)."""
    base = getattr(model, "base_model", None)
    return base if base is not None and base is not model else model


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tok", disable=not enabled, dynamic_ncols=True,
                leave=False)


def collect_statistics(model, geo: AttentionGeometry, ids: torch.Tensor, *,
                       max_tokens: int, chunk_len: int = 1024,
                       progress: bool = True) -> list[LayerStats]:
    """Stream ``ids [N]`` (first ``max_tokens``) through the model in chunks of
    ``chunk_len`` and accumulate every layer's statistics.

    The progress bar counts tokens per layer: it advances by the chunk length each time
    a layer has consumed the chunk (total ``num_layers * tokens``).
    """
    expect(ids.dim() == 1, "ids", "a 1-D token tensor", ids)
    stats = [LayerStats(geo.num_kv_heads, geo.num_qo_heads, geo.head_dim)
             for _ in range(geo.num_layers)]
    total = min(int(max_tokens), ids.numel())
    bar = _progress(total * geo.num_layers, "calibrate (token x layer)", progress)
    device = next(model.parameters()).device

    def observe(i, q, k, v, o, scaling):
        b, hq, t, d = q.shape
        stats[i].update(q.transpose(1, 2).reshape(b * t, hq, d).float().cpu(),
                        k.transpose(1, 2).reshape(b * t, -1, d).float().cpu(),
                        v.transpose(1, 2).reshape(b * t, -1, d).float().cpu(),
                        o.reshape(b * t, hq, d).float().cpu())
        bar.set_postfix_str(f"layer {i + 1}/{geo.num_layers}", refresh=False)
        bar.update(b * t)

    with torch.no_grad(), capture_attention(model, observe):
        for chunk in iter_chunks(ids, chunk_len, total):
            _backbone(model)(input_ids=chunk[None].to(device), use_cache=False)
    bar.close()
    return stats


def collect_heldout(model, geo: AttentionGeometry, ids: torch.Tensor, *, seq_len: int,
                    num_sequences: int, queries_per_sequence: int = 64,
                    min_query_position: int = 512) -> list[list[HeldoutSequence]]:
    """Per layer, ``num_sequences`` :class:`HeldoutSequence` of ``seq_len`` tokens cut
    consecutively from ``ids`` (fewer when ``ids`` is shorter; at least one)."""
    n = max(1, min(int(num_sequences), ids.numel() // max(1, seq_len)))
    length = min(seq_len, ids.numel())
    out: list[list[HeldoutSequence]] = [[] for _ in range(geo.num_layers)]
    pos = sample_query_positions(length, queries_per_sequence, min_query_position)
    device = next(model.parameters()).device

    def observe(i, q, k, v, o, scaling):
        q0 = q[0].transpose(0, 1).float().cpu()                 # [T, Hq, D]
        out[i].append(HeldoutSequence(q0[pos].clone(), pos.clone(),
                                      k[0].transpose(0, 1).float().cpu().clone(),
                                      v[0].transpose(0, 1).float().cpu().clone(), scaling))

    with torch.no_grad(), capture_attention(model, observe):
        for s in range(n):
            chunk = ids[s * length:(s + 1) * length]
            _backbone(model)(input_ids=chunk[None].to(device), use_cache=False)
    return out


def fit_all(stats: Sequence[LayerStats], geo: AttentionGeometry, variants: Sequence[Variant],
            provenance: dict) -> dict[str, RotationArtifact]:
    """One artifact per variant, with the published fixed clip ratios."""
    return {v.name: fit_artifact(stats, geo.fingerprint(), v.method, per_head=v.per_head,
                                 provenance=dict(provenance, per_head=v.per_head))
            for v in variants}


@dataclass
class LayerResult:
    """Errors of one (variant, layer): ``errors[policy]`` and the searched clips, plus the
    searched-clip errors on the search buffer (``search_k_error`` with V un-quantized)."""

    errors: dict[str, float] = field(default_factory=dict)
    k_clip: float = DEFAULT_K_CLIP
    v_clip: float = DEFAULT_V_CLIP
    search_k_error: float = float("nan")
    search_v_error: float = float("nan")
    source: str = ""


AUTO = "auto"


def _judge(judge: LayerEvaluator, rot_k, rot_v, res: LayerResult) -> LayerResult:
    res.errors["none"] = judge.error(rot_k, rot_v, 1.0, 1.0)
    res.errors["fixed"] = judge.error(rot_k, rot_v, DEFAULT_K_CLIP, DEFAULT_V_CLIP)
    res.errors["search"] = judge.error(rot_k, rot_v, res.k_clip, res.v_clip)
    return res


def _heads(r: torch.Tensor, n: int) -> torch.Tensor:
    return r if r.shape[0] == n else r.expand(n, -1, -1).clone()


def evaluate_all(artifacts: dict[str, RotationArtifact],
                 search_buffers: list[list[HeldoutSequence]],
                 eval_buffers: list[list[HeldoutSequence]], rule: QuantRule, *,
                 grid: Sequence[float] = CLIP_GRID, v_grid: Sequence[float] | None = None,
                 progress: bool = True,
                 auto_candidates: Sequence[str] = ()) -> dict[str, list[LayerResult]]:
    """For every artifact and layer: search clips on ``search_buffers`` and measure the
    error on ``eval_buffers`` under the ``none`` (1.0/1.0), ``fixed`` (0.96/0.92) and
    ``search`` policies (K ratios from ``grid``, V ratios from ``v_grid``, default
    ``grid``).

    With ``auto_candidates`` (names of artifacts), also builds the ``"auto"`` artifact
    (added to ``artifacts``): per layer, ``R_K`` of the candidate whose searched-clip key
    error on the search buffer is lowest and ``R_V`` of the candidate whose value error is
    lowest, with the searched clips re-searched for that pair. Selection sees only the
    search buffer (calibration text), never the held-out text.
    """
    from tqdm.auto import tqdm

    num_layers = len(eval_buffers)
    names = list(artifacts)
    results: dict[str, list[LayerResult]] = {name: [] for name in names}
    auto_layers = []
    bar = tqdm(total=num_layers * (len(names) + bool(auto_candidates)),
               desc="clip search + report", unit="layer", disable=not progress,
               dynamic_ncols=True, leave=False)
    for i in range(num_layers):
        searcher = LayerEvaluator(search_buffers[i], rule)
        judge = LayerEvaluator(eval_buffers[i], rule)
        for name in names:
            lr = artifacts[name].layer(i)
            kc, vc, ke, ve = searcher.search_clip_with_errors(lr.rot_k, lr.rot_v, grid, v_grid)
            results[name].append(_judge(judge, lr.rot_k, lr.rot_v,
                                        LayerResult(k_clip=kc, v_clip=vc, search_k_error=ke,
                                                    search_v_error=ve, source=name)))
            bar.update(1)
        if auto_candidates:
            kname = min(auto_candidates, key=lambda n: results[n][i].search_k_error)
            vname = min(auto_candidates, key=lambda n: results[n][i].search_v_error)
            lk, lv = artifacts[kname].layer(i), artifacts[vname].layer(i)
            hr = max(lk.rot_k.shape[0], lv.rot_v.shape[0])
            rk, rv = _heads(lk.rot_k, hr), _heads(lv.rot_v, hr)
            kc, vc, ke, ve = searcher.search_clip_with_errors(rk, rv, grid, v_grid)
            ek = None if lk.k_eigenvalues is None else _heads(lk.k_eigenvalues[..., None],
                                                              hr)[..., 0]
            evv = None if lv.v_eigenvalues is None else _heads(lv.v_eigenvalues[..., None],
                                                               hr)[..., 0]
            auto_layers.append(LayerRotation(rk, rv, kc, vc, ek, evv))
            results.setdefault(AUTO, []).append(_judge(
                judge, rk, rv, LayerResult(k_clip=kc, v_clip=vc, search_k_error=ke,
                                           search_v_error=ve, source=f"K:{kname} V:{vname}")))
            bar.update(1)
    bar.close()
    if auto_candidates:
        first = artifacts[auto_candidates[0]]
        prov = dict(first.provenance, auto_sources=[r.source for r in results[AUTO]],
                    auto_candidates=list(auto_candidates))
        art = RotationArtifact(first.fingerprint, AUTO, auto_layers, prov)
        art.validate()
        artifacts[AUTO] = art
    return results


def with_clips(art: RotationArtifact, k_clips: Sequence[float], v_clips: Sequence[float],
               clip_policy: str) -> RotationArtifact:
    """A copy of ``art`` carrying per-layer clips and the clip policy in its provenance."""
    from ..rotation import LayerRotation

    layers = [LayerRotation(lr.rot_k, lr.rot_v, float(k), float(v), lr.k_eigenvalues,
                            lr.v_eigenvalues)
              for lr, k, v in zip(art.layers, k_clips, v_clips)]
    out = RotationArtifact(art.fingerprint, art.method, layers,
                           dict(art.provenance, clip_policy=clip_policy), art.format_version)
    out.validate()
    return out


class Timer:
    """Wall-clock seconds of named phases."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self._t, 2)
        self._t = now
