"""The evaluation's outputs: one row per method, the Markdown table, the PNG, the files.

:func:`build_rows` joins the metrics of every method with its bits and clip ratios and,
against ``bf16`` on the same passkey prompts, the paired lost/won count (exact McNemar p);
:func:`write_outputs` writes ``results.md``, ``results.json`` and ``results.png``, each
atomically (a temporary file in the same directory, then renamed).
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence

import torch

from ..rotation import atomic_output
from .methods import BASELINE, Method


def _fmt(x, nd=2):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}"


def build_rows(methods: Sequence[Method], ppl: dict, passkey: dict | None, fingerprint,
               contexts: Sequence[int], tail_start: int) -> list[dict]:
    """One dict per method with every metric (the JSON rows)."""
    from .passkey import paired_comparison

    ctx = max(contexts)
    base = ppl.get(BASELINE)
    base_pk = passkey.get(BASELINE) if passkey is not None else None
    rows = []
    for m in methods:
        r = {"method": m.name, "clip": m.clip, "label": m.label, "kind": m.kind,
             "source": m.source, "bits_int2": round(m.bits(fingerprint), 4),
             f"bits@{ctx}": round(m.bits(fingerprint, ctx), 4)}
        if m.kind == "int2":
            kc, vc = m.clip_ratios()
            r["k_clip"], r["v_clip"] = kc, vc
            r["group_size"] = m.group_size or fingerprint.head_dim
            r["sink_size"], r["recent_size"] = m.sink_size, m.recent_size
        r.update(ppl.get(m.label, {}))
        key = f"tail_ppl@{ctx}"
        if base and key in r and key in base:
            r[f"tail_ppl@{ctx}_vs_bf16_pct"] = 100.0 * (r[key] / base[key] - 1.0)
        if passkey is not None and m.label in passkey:
            pk = passkey[m.label]
            r["passkey"] = pk["accuracy"]
            r["passkey_correct"], r["passkey_n"] = pk.get("correct"), pk.get("n")
            r["passkey_ci95"] = pk.get("ci95")
            r["passkey_by_length"] = pk.get("by_length")
            if base_pk is not None and m.label != BASELINE:
                r["passkey_vs_bf16"] = paired_comparison(
                    [t["correct"] for t in pk["trials"]],
                    [t["correct"] for t in base_pk["trials"]])
            r["passkey_trials"] = pk["trials"]
            r["passkey_seconds"] = pk["seconds"]
        rows.append(r)
    return rows


def format_passkey(row: dict) -> str:
    """``"54/60 = 0.90 [0.80, 0.95]"`` (Wilson 95%), or the bare accuracy of a row without
    counts, ``"-"`` without passkey."""
    acc = row.get("passkey")
    if acc is None:
        return "-"
    k, n, ci = row.get("passkey_correct"), row.get("passkey_n"), row.get("passkey_ci95")
    if k is None or n is None or ci is None:
        return _fmt(acc, 2)
    return f"{k}/{n} = {acc:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def markdown_table(rows: Sequence[dict], contexts: Sequence[int], tail_start: int) -> str:
    ctx = max(contexts)
    cols = [("method", "method", None), ("clip", "clip", None),
            ("bits INT2", "bits_int2", 2), (f"bits @{ctx}", f"bits@{ctx}", 2)]
    for c in sorted(contexts):
        cols.append((f"ppl @{c}", f"ppl@{c}", 2))
        if c > tail_start:
            cols.append((f"tail ppl @{c}", f"tail_ppl@{c}", 2))
    cols += [(f"Δ tail @{ctx}", f"tail_ppl@{ctx}_vs_bf16_pct", None),
             ("KL (nats)", "kl", 4), ("top-1", "top1", 3), ("passkey [95% CI]", "passkey", 2),
             ("passkey lost/won vs bf16", "passkey_vs_bf16", None)]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |",
             "|" + "|".join(" --- " for _ in cols) + "|"]
    for r in rows:
        cells = []
        for _, key, nd in cols:
            v = r.get(key)
            if key == "passkey":
                cells.append(format_passkey(r))
            elif key == "passkey_vs_bf16":
                cells.append("-" if v is None
                             else f"{v['lost']}/{v['won']} (p={v['p_mcnemar']:.2g})")
            elif key.endswith("_vs_bf16_pct"):
                cells.append("-" if v is None or r["kind"] == "bf16" else f"{v:+.1f}%")
            elif nd is None:
                cells.append(str(v) if v is not None else "-")
            else:
                cells.append(_fmt(v, nd))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: Sequence[dict], contexts: Sequence[int], tail_start: int, path: str,
         title: str = "") -> None:
    """Bar charts, one panel per metric, one bar per method (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx = max(contexts)
    metrics = [(f"tail_ppl@{ctx}", f"tail perplexity @{ctx} (p >= {tail_start})"),
               (f"ppl@{ctx}", f"perplexity @{ctx}"),
               ("kl", "KL(bf16 || method), nats"), ("top1", "top-1 agreement with bf16"),
               ("passkey", "passkey accuracy"),
               ("bits_int2", "bits / element, INT2 region (scales included)")]
    metrics = [(k, t) for k, t in metrics if any(k in r for r in rows)]
    labels = [r["label"] for r in rows]
    colors = ["#555555" if r["kind"] == "bf16" else "#d62728" if r["method"] == "oscar"
              else "#1f77b4" if r["kind"] == "int2" else "#2ca02c" for r in rows]
    ncol = 3
    nrow = -(-len(metrics) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.6 * nrow + 0.8), squeeze=False)
    for ax, (key, t) in zip(axes.flat, metrics):
        vals = [r.get(key, float("nan")) for r in rows]
        yerr = None
        if key == "passkey" and all(r.get("passkey_ci95") for r in rows):
            yerr = [[v - r["passkey_ci95"][0] for v, r in zip(vals, rows)],
                    [r["passkey_ci95"][1] - v for v, r in zip(vals, rows)]]
            t += " (Wilson 95%)"
        ax.bar(range(len(rows)), vals, color=colors, yerr=yerr, capsize=2 if yerr else 0)
        ax.set_title(t, fontsize=10)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        if key.startswith("tail_ppl") or key.startswith("ppl"):
            base = next((r.get(key) for r in rows if r["kind"] == "bf16"), None)
            if base:
                ax.axhline(base, color="#555555", lw=0.8, ls="--")
                finite = [v for v in vals if v == v]
                ax.set_ylim(0, min(max(finite) * 1.05, base * 3))
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def environment() -> dict:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "machine": platform.machine(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _stride_text(stride) -> str:
    if isinstance(stride, (list, tuple)):
        return ("; the merged parts ran " + " or ".join(
            "every prompt" if k == 1 else f"one prompt in {k}" for k in stride)
            + " of the grid (each row shows its own count)")
    return f"; one prompt in {stride} of the grid" if (stride or 1) > 1 else ""


def _coverage_text(meta: dict, ctx: int) -> str:
    """Which tokens the windows cover: they are consecutive from the start of the held-out
    stream (the files concatenated in the order given), so later files may not be read."""
    total = meta.get("heldout_tokens")
    if not total or not meta.get("windows"):
        return ""
    return (f", consecutive from the start of the held-out stream (files in the order "
            f"given): its first {min(total, meta['windows'] * ctx):,} of {total:,} tokens")


def _passkey_text(meta: dict) -> str:
    if meta.get("passkey_lengths") is None:
        return "Passkey: not run."
    return ("Passkey: lengths "
            f"{meta.get('passkey_lengths')}, depths {meta.get('passkey_depths')}, "
            f"{meta.get('passkey_keys_per_cell', 1)} key(s) per (length, depth) (seed "
            f"{meta.get('passkey_seed', 0)}"
            + _stride_text(meta.get("passkey_trial_stride"))
            + f"), greedy, {meta.get('passkey_cache')} cache; "
            "accuracy with a Wilson 95% interval; lost/won = trials bf16 gets right and the "
            "method misses / the reverse, on the same prompts (exact McNemar p).")


def write_outputs(out_dir: str, rows: Sequence[dict], meta: dict, contexts: Sequence[int],
                  tail_start: int, notes: Sequence[str] = ()) -> tuple[str, str, str]:
    """Write ``results.md``, ``results.json``, ``results.png`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    md_path = os.path.join(out_dir, "results.md")
    js_path = os.path.join(out_dir, "results.json")
    png_path = os.path.join(out_dir, "results.png")
    table = markdown_table(rows, contexts, tail_start)
    ctx = max(contexts)
    lines = [f"# INT2 KV cache evaluation: {meta.get('model_name', 'model')}", "",
             f"Command: `{meta.get('command', '')}`", "",
             f"Held-out text: {meta.get('heldout', '')}; {meta.get('windows')} windows of "
             f"{ctx} tokens" + _coverage_text(meta, ctx) + "; tail = predicted tokens at "
             f"positions >= {tail_start}; KL and "
             f"top-1 over the tail positions of the {ctx}-token context. INT2 rows: format "
             f"v1 (sink {meta.get('sink_size')}, recent {meta.get('recent_size')}, group "
             f"{meta.get('group_size')}, fp16 scale/zero), exact teacher-forced emulation of "
             "the serving read rule. " + _passkey_text(meta), "",
             table, ""]
    if notes:
        lines += ["Not measured:", ""] + [f"- {n}" for n in notes] + [""]
    if meta.get("parts"):
        lines += [f"Merged from {len(meta['parts'])} runs (`perf/tools/merge_parts.py`): "
                  + "; ".join(f"`{p['dir']}` ({p['seconds_total']:.0f} s, {p['date']})"
                              for p in meta["parts"]) + ".", ""]
    lines += [f"Wall time {meta.get('seconds_total', 0):.0f} s on {meta['environment']['cpu_count']}"
              f" CPU(s), {meta['environment']['threads']} torch threads, load average at start "
              f"{meta['environment'].get('loadavg_start')}; {meta.get('date', '')}.", ""]
    with atomic_output(md_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    with atomic_output(js_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": list(rows), "notes": list(notes)}, f, indent=1,
                  default=str)
    with atomic_output(png_path) as tmp:
        plot(rows, contexts, tail_start, tmp, title=meta.get("model_name", ""))
    return md_path, js_path, png_path
