"""Per-layer attention-error report of a calibration run: Markdown, JSON, console table."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from ..rotation import atomic_output
from .pipeline import CLIP_POLICIES, LayerResult


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / max(1, len(xs))


def summarize(results: dict[str, list[LayerResult]]) -> dict[str, dict[str, float]]:
    """``{variant: {policy: mean error over layers}}``."""
    return {name: {p: mean([r.errors[p] for r in rs]) for p in CLIP_POLICIES}
            for name, rs in results.items()}


def best_variant(results: dict[str, list[LayerResult]], policy: str,
                 candidates: Sequence[str] | None = None) -> str:
    """The variant with the lowest mean error under ``policy``."""
    summary = summarize(results)
    names = list(candidates) if candidates else list(summary)
    return min(names, key=lambda n: summary[n][policy])


def to_json(results: dict[str, list[LayerResult]], meta: dict) -> dict:
    return {
        "meta": meta,
        "mean_error": summarize(results),
        "layers": {name: [{"errors": r.errors, "searched_k_clip": r.k_clip,
                           "searched_v_clip": r.v_clip, "search_k_error": r.search_k_error,
                           "search_v_error": r.search_v_error, "source": r.source}
                          for r in rs]
                   for name, rs in results.items()},
    }


def console_table(results: dict[str, list[LayerResult]], shipped: str, policy: str) -> str:
    """Per-layer table: the error of every variant under ``policy`` and the shipped
    variant's clip ratios, then the mean row."""
    names = list(results)
    width = max(9, *(len(n) for n in names))
    head = f"{'layer':>5} " + " ".join(f"{n:>{width}}" for n in names) + "   k_clip v_clip"
    lines = [f"relative attention-output error on held-out text (clip policy: {policy}; "
             f"shipped: {shipped})", head, "-" * len(head)]
    num_layers = len(results[names[0]])
    for i in range(num_layers):
        row = " ".join(f"{results[n][i].errors[policy]:>{width}.4f}" for n in names)
        r = results[shipped][i]
        kc, vc = (r.k_clip, r.v_clip) if policy == "search" else (
            (1.0, 1.0) if policy == "none" else (0.96, 0.92))
        lines.append(f"{i:>5} {row}   {kc:6.2f} {vc:6.2f}")
    summary = summarize(results)
    lines.append("-" * len(head))
    lines.append(f"{'mean':>5} " + " ".join(f"{summary[n][policy]:>{width}.4f}" for n in names))
    return "\n".join(lines)


def to_markdown(results: dict[str, list[LayerResult]], meta: dict) -> str:
    summary = summarize(results)
    names = list(results)
    out = ["# oscar-kv calibrate report", ""]
    out.append("Relative Frobenius error ||O - O_ref|| / ||O_ref|| of the attention output "
               "(per layer, over sampled queries and all heads) on held-out text, with the "
               "cache's read rule (BF16 sink/recent windows, INT2 elsewhere). "
               "Clip policies: `none` = 1.0/1.0, `fixed` = 0.96/0.92 (published defaults), "
               "`search` = per-layer ratios searched on held-out *calibration* tokens.")
    out += ["", "## Settings", ""]
    for k, v in meta.items():
        out.append(f"- **{k}**: `{json.dumps(v) if not isinstance(v, str) else v}`")
    out += ["", "## Mean over layers", "",
            "| variant | " + " | ".join(CLIP_POLICIES) + " |",
            "|---|" + "---:|" * len(CLIP_POLICIES)]
    for n in names:
        out.append(f"| {n} | " + " | ".join(f"{summary[n][p]:.4f}" for p in CLIP_POLICIES)
                   + " |")
    out += ["", "## Per layer (fixed / search; searched k_clip, v_clip)", "",
            "| layer | " + " | ".join(names) + " |", "|---:|" + "---|" * len(names)]
    for i in range(len(results[names[0]])):
        cells = []
        for n in names:
            r = results[n][i]
            cells.append(f"{r.errors['fixed']:.4f} / {r.errors['search']:.4f} "
                         f"({r.k_clip:.2f}, {r.v_clip:.2f})")
        out.append(f"| {i} | " + " | ".join(cells) + " |")
    if "auto" in results:
        out += ["", "## auto: rotation chosen per layer (on the clip-search buffer)", ""]
        out += [f"- layer {i}: {r.source}" for i, r in enumerate(results["auto"])]
    return "\n".join(out) + "\n"


def write_report(results: dict[str, list[LayerResult]], meta: dict, path_prefix: str
                 ) -> tuple[str, str]:
    """Write ``{path_prefix}.md`` and ``{path_prefix}.json`` (each atomically); return
    both paths."""
    os.makedirs(os.path.dirname(os.path.abspath(path_prefix)), exist_ok=True)
    md, js = path_prefix + ".md", path_prefix + ".json"
    with atomic_output(md) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(to_markdown(results, meta))
    with atomic_output(js) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(to_json(results, meta), f, indent=1)
    return md, js
