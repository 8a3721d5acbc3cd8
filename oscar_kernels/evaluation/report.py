"""The evaluation's outputs: one row per method, the Markdown table, the PNG, the files.

:func:`build_rows` joins the metrics of every method with its bits and clip ratios and,
against ``bf16`` on the same passkey prompts, the paired lost/won count (exact McNemar p);
:func:`write_outputs` writes ``results.md``, ``results.json`` and ``results.png``, each
atomically (a temporary file in the same directory, then renamed). ``results.md`` opens with
the verdict (:func:`verdict`): the shipped default (:func:`shipped_default`, the calibration's
default method and clip policy) against BF16 and against the best other row. Run as a module,
it writes ``results.md`` and ``results.png`` again from a ``results.json``::

    python -m oscar_kernels.evaluation.report docs/example-demo/results.json docs/example-demo/
"""

from __future__ import annotations

import json
import math
import os
import platform
import textwrap
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


def shipped_default() -> tuple[str, str]:
    """``(method, clip)`` of the shipped recipe as the rows name them: the calibration's
    default method with its default clip policy (``"search"`` is a ``"searched"`` row)."""
    from ..calibration.calibrate_cmd import DEFAULT_CLIP, DEFAULT_METHOD

    return DEFAULT_METHOD, ("searched" if DEFAULT_CLIP in ("search", "searched")
                            else DEFAULT_CLIP)


def shipped_row(rows: Sequence[dict]) -> dict | None:
    """The row that measures the shipped default: one named ``shipped`` (the artifact
    ``oscar-kv calibrate`` writes with no options, evaluated by name) or else the first
    INT2 row with the shipped method and clip policy."""
    int2 = [r for r in rows if r.get("kind") == "int2"]
    named = [r for r in int2 if r.get("method") == "shipped"]
    if named:
        return named[0]
    return next((r for r in int2 if (r.get("method"), r.get("clip")) == shipped_default()), None)


def is_shipped(row: dict, rows: Sequence[dict]) -> bool:
    """Whether ``row`` is :func:`shipped_row` of ``rows``."""
    return row is shipped_row(rows)


def _tail_key(rows: Sequence[dict], ctx: int) -> str:
    """The perplexity the verdict and the figure rank by: tail perplexity at the evaluated
    context, or the full-window perplexity when the tail was not measured."""
    key = f"tail_ppl@{ctx}"
    return key if any(key in r for r in rows) else f"ppl@{ctx}"


def best_baseline(rows: Sequence[dict], ctx: int) -> dict | None:
    """The non-shipped INT2 or KIVI row with the lowest tail perplexity at ``ctx``."""
    key = _tail_key(rows, ctx)
    cands = [r for r in rows if r.get("kind") != "bf16" and not is_shipped(r, rows)
             and r.get(key) is not None and math.isfinite(r[key])]
    return min(cands, key=lambda r: r[key]) if cands else None


def _name(row: dict) -> str:
    return row["label"] if row.get("kind") != "int2" else f"{row['method']} ({row['clip']} clip)"


def _count(row: dict) -> str | None:
    k, n = row.get("passkey_correct"), row.get("passkey_n")
    if k is not None and n:
        return f"{k}/{n}"
    return None if row.get("passkey") is None else f"{row['passkey']:.2f}"


def _change(a: float, b: float) -> str:
    """``"raises ... by 3.3%"`` / ``"lowers ... by 0.4%"`` of ``a`` against ``b``."""
    d = 100.0 * (a / b - 1.0)
    return ("raises" if d >= 0 else "lowers"), f"{abs(d):.1f}%"


def _kl_top1(row: dict) -> str:
    """``"KL 0.045 nats, top-1 0.884"`` (what of it the row has), for the verdict."""
    parts = []
    if row.get("kl") is not None:
        parts.append(f"KL {row['kl']:.3f} nats")
    if row.get("top1") is not None:
        parts.append(f"top-1 {row['top1']:.3f}")
    return ", ".join(parts)


def verdict(rows: Sequence[dict], contexts: Sequence[int], meta: dict | None = None) -> str:
    """The opening paragraph of ``results.md``: the shipped default against BF16 and
    against the best baseline row, with the uncertainty the data supports."""
    meta = meta or {}
    ctx = max(contexts)
    key = _tail_key(rows, ctx)
    what = "tail perplexity" if key.startswith("tail") else "perplexity"
    method, clip = shipped_default()
    ship = next((r for r in rows if is_shipped(r, rows)), None)
    if ship is None or key not in ship:
        return (f"**Verdict:** the shipped default ({method}, {clip} clip) is not among "
                "these rows; the table compares the rows measured.")
    base = next((r for r in rows if r.get("kind") == "bf16" and key in r), None)
    best = best_baseline(rows, ctx)
    bits = ship.get(f"bits@{ctx}")
    bits_text = f" at {bits:.2f} bits per element @{ctx}" if bits is not None else ""
    if base is not None:
        verb, by = _change(ship[key], base[key])
        first = (f"**Verdict:** the shipped default, **{method} ({clip} clip)**{bits_text}, "
                 f"{verb} {what} @{ctx} by {by} over BF16 "
                 f"({ship[key]:.2f} vs {base[key]:.2f}"
                 + (f"; {_kl_top1(ship)})" if _kl_top1(ship) else ")"))
        if _count(ship) and _count(base):
            first += f" and retrieves the passkey in {_count(ship)} vs BF16 {_count(base)}"
    else:
        first = (f"**Verdict:** the shipped default, **{method} ({clip} clip)**{bits_text}, "
                 f"reaches {what} @{ctx} {ship[key]:.2f}"
                 + (f" ({_kl_top1(ship)})" if _kl_top1(ship) else "")
                 + " (no BF16 row was measured)")
    sentences = [first + "."]
    if best is not None:
        verb, by = _change(ship[key], best[key])
        second = (f"Against the best other row by {what}, {_name(best)} at {best[key]:.2f}"
                  + (f" ({_kl_top1(best)})" if _kl_top1(best) else "")
                  + f", it {verb} {what} by {by}")
        if _count(ship) and _count(best):
            second += f", passkey {_count(ship)} vs {_count(best)}"
        sentences.append(second + ".")
    # the uncertainty the data supports
    unc = []
    windows = meta.get("windows")
    tokens = (ship.get("tokens") or {}).get(key)
    if windows or tokens:
        over = (f"{windows} window{'s' if windows != 1 else ''} " if windows else "") + (
            f"({tokens:,} scored tokens)" if tokens else "")
        unc.append(f"{what[0].upper() + what[1:]}, KL and top-1 are point estimates over "
                   f"{over.strip()}, without an interval")
    n = ship.get("passkey_n")
    if n:
        ci = ship.get("passkey_ci95")
        if n < 20:
            unc.append(f"with {n} passkey trials per row an interval is too wide to say much"
                       + (f" (Wilson 95% for {_count(ship)}: [{ci[0]:.2f}, {ci[1]:.2f}])"
                          if ci else ""))
        else:
            pk = f"passkey Wilson 95% [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "passkey"
            pair = ship.get("passkey_vs_bf16")
            if pair:
                pk += (f", lost/won against BF16 on the same prompts {pair['lost']}/"
                       f"{pair['won']} (exact McNemar p={pair['p_mcnemar']:.2g})")
            unc.append(pk)
    if unc:
        text = "; ".join(unc)
        sentences.append(text[0].upper() + text[1:] + ".")
    return " ".join(sentences)


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
    """The results table, one line per row; the shipped default's method reads
    ``"<method> (shipped)"``."""
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
            if key == "method" and is_shipped(r, rows):
                cells.append(f"**{v} (shipped)**")
            elif key == "passkey":
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


#: marker and colour of each rotation family in the figure (the name's longest prefix);
#: filled for searched clips, hollow for fixed ones
FAMILIES = {"bf16": ("*", "#333333"), "naive": ("v", "#8c564b"),
            "hadamard": ("s", "#1f77b4"), "oscar": ("^", "#ff7f0e"),
            "kv-cov": ("o", "#2ca02c"), "auto": ("D", "#9467bd"), "kivi": ("P", "#e377c2")}
OTHER_FAMILY = ("h", "#7f7f7f")
SHIPPED_COLOR = "#d62728"


def _family(row: dict) -> str | None:
    name = str(row.get("method", ""))
    hits = [f for f in FAMILIES if name == f or name.startswith(f + "-")]
    return max(hits, key=len) if hits else None


def axis_cap(values: Sequence[float], jump: float = 3.0) -> float | None:
    """Where to cut a panel's axis so that one or two outliers do not squash the rest: just
    above the last value before the first jump of more than ``jump``x in the upper half of
    the sorted positive values, or ``None`` when there is no such jump."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v) and v > 0)
    for i in range(len(vals) // 2, len(vals) - 1):
        if vals[i + 1] > jump * vals[i]:
            return vals[i] * 1.35
    return None


def _bits_line(rows: Sequence[dict], ctx: int) -> str:
    """One line: the bits per element of each kind of row, in the quantized region and at
    ``ctx`` tokens (scales and the BF16 sink/recent windows included)."""
    groups: dict[tuple, list[str]] = {}
    for r in rows:
        b = (r.get("bits_int2"), r.get(f"bits@{ctx}"))
        if b[0] is None:
            continue
        kind = {"bf16": "BF16", "kivi": "KIVI-2", "int2": "INT2 rows"}.get(r["kind"], r["kind"])
        if kind not in groups.setdefault(b, []):
            groups[b].append(kind)
    parts = [f"{' / '.join(kinds)} {b_int2:g}" if b_int2 == b_ctx or b_ctx is None
             else f"{' / '.join(kinds)} {b_int2:.2f} / {b_ctx:.2f}"
             for (b_int2, b_ctx), kinds in groups.items()]
    return (f"Bits per element, quantized region / at {ctx} tokens (scales and BF16 "
            "windows included): " + "; ".join(parts) + ".")


def plot(rows: Sequence[dict], contexts: Sequence[int], tail_start: int, path: str,
         title: str = ""):
    """One figure, one line per row (BF16 first, then by tail perplexity): the change
    against BF16, KL, top-1 agreement and passkey counts; markers by rotation family, filled
    for searched clips, hollow for fixed; the shipped default ringed; a value beyond a
    panel's cut axis is drawn at the edge with its value. Written as PNG (Agg backend);
    returns the (closed) figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ctx = max(contexts)
    key = _tail_key(rows, ctx)
    base = next((r for r in rows if r.get("kind") == "bf16" and key in r), None)

    def delta(r):
        if r.get(key) is None or base is None:
            return None
        return 100.0 * (r[key] / base[key] - 1.0)

    order = sorted(rows, key=lambda r: (r.get("kind") != "bf16",
                                        delta(r) if delta(r) is not None else math.inf))
    ys = list(range(len(order)))
    panels = [("delta", f"{'tail ' if key.startswith('tail') else ''}perplexity @{ctx}\n"
                        "change against BF16 (%)", 3.0)]
    if any(r.get("kl") is not None for r in rows):
        panels.append(("kl", "KL(BF16 || row), nats\n(lower is better)", 1.6))
    if any(r.get("top1") is not None for r in rows):
        panels.append(("top1", "top-1 agreement with BF16\n(higher is better)", 1.6))
    has_pk = any(r.get("passkey") is not None for r in rows)
    if has_pk:
        panels.append(("passkey", "passkey retrieved (k/n)", 1.8))
    fig_h = 3.0 + 0.42 * len(order)
    fig, axes = plt.subplots(1, len(panels), sharey=True, squeeze=False,
                             figsize=(1.45 * sum(w for *_, w in panels) + 2.2, fig_h),
                             gridspec_kw={"width_ratios": [w for *_, w in panels]})
    axes = axes[0]

    def style(r):
        fam = _family(r)
        marker, color = FAMILIES.get(fam, OTHER_FAMILY)
        hollow = r.get("clip") == "fixed"
        return dict(marker=marker, s=90 if marker == "*" else 60, linewidths=1.5,
                    edgecolors=color, facecolors="white" if hollow else color, zorder=3)

    for ax, (what, label, _) in zip(axes, panels):
        if what == "delta":
            vals = [delta(r) for r in order]
        elif what == "passkey":
            vals = [r.get("passkey") for r in order]
        else:
            vals = [r.get(what) for r in order]
        cap = axis_cap(vals) if what in ("delta", "kl") else None
        for y, r, v in zip(ys, order, vals):
            if v is None:
                ax.text(0.5, y, "not measured", transform=ax.get_yaxis_transform(),
                        ha="center", va="center", fontsize=8, color="0.5")
                continue
            clipped = cap is not None and v > cap
            x = cap if clipped else v
            if clipped:
                st = style(r)
                ax.scatter([x], [y], marker=">", s=70, edgecolors=st["edgecolors"],
                           facecolors=st["facecolors"], linewidths=1.5, zorder=3, clip_on=False)
                ax.annotate(f"{v:+.0f}%" if what == "delta" else f"{v:.2f}", (x, y),
                            xytext=(-8, 0), textcoords="offset points", ha="right",
                            va="center", fontsize=8, fontweight="bold")
            else:
                ax.scatter([x], [y], clip_on=False, **style(r))
            intervals = (what == "passkey" and bool(r.get("passkey_n"))
                         and r["passkey_n"] >= 20 and bool(r.get("passkey_ci95")))
            if intervals:
                lo, hi = r["passkey_ci95"]
                ax.plot([lo, hi], [y, y], color=style(r)["edgecolors"], lw=1.2, zorder=2)
            if is_shipped(r, rows):
                ax.scatter([x], [y], s=320, facecolors="none", edgecolors=SHIPPED_COLOR,
                           linewidths=2, zorder=4, clip_on=False)
            gap = 14 if is_shipped(r, rows) else 9
            if what == "delta" and not clipped and r.get("kind") != "bf16":
                ax.annotate(f"{v:+.1f}%", (x, y), xytext=(gap, 0), textcoords="offset points",
                            va="center", fontsize=8)
            if what == "passkey" and intervals:      # above the point, clear of the bar
                ax.annotate(_count(r), (x, y), xytext=(0, gap - 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7.5)
            elif what == "passkey":
                ax.annotate(_count(r), (x, y), xytext=(-gap, 0) if v > 0.6 else (gap, 0),
                            textcoords="offset points", ha="right" if v > 0.6 else "left",
                            va="center", fontsize=8)
        finite = [v for v in vals if v is not None and math.isfinite(v)]
        if what in ("delta", "kl"):
            hi = cap if cap is not None else max(finite + [0.0])
            lo = min(finite + [0.0])
            pad = 0.08 * (hi - lo or 1.0)
            ax.set_xlim(lo - pad, hi + (pad if cap is not None else 0.35 * (hi - lo or 1.0)))
            ax.axvline(0, color="0.4", lw=0.8, ls="--", zorder=1)
            if cap is not None:
                label += "\n(axis cut: ▶ = value beyond it)"
        else:
            ax.set_xlim(-0.08, 1.12)
            if what == "top1":
                ax.axvline(1.0, color="0.4", lw=0.8, ls="--", zorder=1)
            elif base is not None and base.get("passkey") is not None:
                ax.axvline(base["passkey"], color="0.4", lw=0.8, ls="--", zorder=1)
            if what == "passkey":
                ns = [r["passkey_n"] for r in order if r.get("passkey_n")]
                if ns and min(ns) < 20:
                    label += f"\nno interval drawn: n = {min(ns)} < 20"
                elif ns:
                    label += "\nbars: Wilson 95%"
        ax.set_title(label, fontsize=9.5)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_ylim(len(order) - 0.5, -0.5)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels([("★ shipped: " if is_shipped(r, rows) else "") + _name(r)
                             for r in order], fontsize=9)
    for t, r in zip(axes[0].get_yticklabels(), order):
        if is_shipped(r, rows):
            t.set_color(SHIPPED_COLOR)
            t.set_fontweight("bold")
    handles = []
    present = {_family(r) for r in rows}
    for fam, (marker, color) in FAMILIES.items():
        if fam in present:
            handles.append(Line2D([], [], ls="", marker=marker, color=color, ms=8, label=fam))
    if None in present:
        handles.append(Line2D([], [], ls="", marker=OTHER_FAMILY[0], color=OTHER_FAMILY[1],
                              ms=8, label="other rotation"))
    clips = {r.get("clip") for r in rows}
    if "searched" in clips:
        handles.append(Line2D([], [], ls="", marker="o", color="0.3", ms=8,
                              label="searched clip"))
    if "fixed" in clips:
        handles.append(Line2D([], [], ls="", marker="o", mfc="white", mec="0.3", mew=1.5,
                              ms=8, label="fixed clip"))
    if any(is_shipped(r, rows) for r in rows):
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec=SHIPPED_COLOR, mew=2,
                              ms=15, label="shipped default"))
    if base is not None:
        handles.append(Line2D([], [], color="0.4", lw=0.8, ls="--", label="BF16 level"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8.5,
               frameon=False, bbox_to_anchor=(0.5, 0.3 / fig_h))
    fig_w = fig.get_figwidth()
    fig.text(0.5, 0.08 / fig_h, textwrap.fill(_bits_line(rows, ctx), int(fig_w * 15)),
             ha="center", va="bottom", fontsize=8.5, color="0.25")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.75 / fig_h, 1, 1))
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return fig


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


def report_markdown(rows: Sequence[dict], meta: dict, contexts: Sequence[int],
                    tail_start: int, notes: Sequence[str] = ()) -> str:
    """The text of ``results.md``: the verdict, the command and setup, the table."""
    table = markdown_table(rows, contexts, tail_start)
    ctx = max(contexts)
    lines = [f"# INT2 KV cache evaluation: {meta.get('model_name', 'model')}", "",
             verdict(rows, contexts, meta), "",
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
    env = meta["environment"]
    lines += [f"Wall time {meta.get('seconds_total', 0):.0f} s on {env['cpu_count']} CPU(s), "
              f"{env['threads']} torch threads, load average at start "
              f"{env.get('loadavg_start')}; {meta.get('date', '')}.", ""]
    return "\n".join(lines)


def write_report(out_dir: str, rows: Sequence[dict], meta: dict, contexts: Sequence[int],
                 tail_start: int, notes: Sequence[str] = ()) -> tuple[str, str]:
    """Write ``results.md`` and ``results.png`` into ``out_dir`` (each atomically)."""
    os.makedirs(out_dir, exist_ok=True)
    md_path = os.path.join(out_dir, "results.md")
    png_path = os.path.join(out_dir, "results.png")
    with atomic_output(md_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(report_markdown(rows, meta, contexts, tail_start, notes))
    with atomic_output(png_path) as tmp:
        plot(rows, contexts, tail_start, tmp, title=f"{meta.get('model_name', 'model')}: "
             f"INT2 KV cache rows against BF16, {max(contexts)}-token context")
    return md_path, png_path


def write_outputs(out_dir: str, rows: Sequence[dict], meta: dict, contexts: Sequence[int],
                  tail_start: int, notes: Sequence[str] = ()) -> tuple[str, str, str]:
    """Write ``results.md``, ``results.json``, ``results.png`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    js_path = os.path.join(out_dir, "results.json")
    with atomic_output(js_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": list(rows), "notes": list(notes)}, f, indent=1,
                  default=str)
    md_path, png_path = write_report(out_dir, rows, meta, contexts, tail_start, notes)
    return md_path, js_path, png_path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m oscar_kernels.evaluation.report RESULTS_JSON [OUT_DIR]``: write
    ``results.md`` and ``results.png`` again from a ``results.json`` (its ``meta``, ``rows``
    and ``notes``) into ``OUT_DIR`` (default: the JSON's folder); the JSON is not touched."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m oscar_kernels.evaluation.report",
                                 description=main.__doc__.split(":", 1)[1].strip())
    ap.add_argument("results_json")
    ap.add_argument("out_dir", nargs="?", default=None)
    a = ap.parse_args(argv)
    with open(a.results_json, encoding="utf-8") as f:
        data = json.load(f)
    meta, rows = data["meta"], data["rows"]
    contexts = meta.get("contexts") or [meta["ctx"]]
    out = a.out_dir or os.path.dirname(os.path.abspath(a.results_json))
    paths = write_report(out, rows, meta, contexts, meta["tail_start"], data.get("notes", ()))
    print("wrote", ", ".join(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
