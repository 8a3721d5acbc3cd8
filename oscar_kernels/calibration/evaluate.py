"""What INT2 does to a real model: perplexity, tail perplexity, KL, top-1, passkey, bits.

Every method runs the same model on the same held-out windows:

* ``bf16`` — the unmodified model (its own attention, full-precision K/V);
* INT2 format v1 methods — a rotation artifact (``naive`` = identity rotation,
  ``hadamard``, ``kv-cov``, ``oscar`` or any artifact given) under a clip policy:
  ``fixed`` (K 0.96, V 0.92 in every layer) or ``searched`` (the artifact's per-layer
  ratios, written by ``oscar-kv calibrate --clip search``). Scored by the exact
  teacher-forced emulation of :mod:`oscar_kernels.integrations.transformers` (query ``t``
  reads BF16 for ``p < sink`` or ``p > t - recent``, INT2 otherwise);
* ``kivi`` — KIVI-2 (:mod:`oscar_kernels.calibration.kivi`), emulation only.

Metrics, per method (token ``p`` is predicted from positions ``< p``):

* ``ppl@C`` — perplexity of tokens ``1 <= p < C`` of each window (a ``C``-token context:
  the first ``C`` tokens of a longer window see exactly what a ``C``-token window would);
* ``tail_ppl@C`` — the same over ``tail_start <= p < C`` (default 512), where most of the
  context is read from the INT2 region;
* ``kl`` — mean ``KL(p_bf16 || p_method)`` (nats) of the next-token distributions over the
  tail positions of the longest context; ``top1`` — fraction of those positions where the
  argmax agrees with ``bf16``;
* ``passkey`` — retrieval accuracy (:mod:`oscar_kernels.calibration.passkey`): greedy
  decoding through a cache (``DynamicCache`` + emulation by default, or the real packed
  :class:`~oscar_kernels.integrations.transformers.OscarCache`), over a
  lengths x depths x keys grid, with a Wilson 95% interval and a paired lost/won count
  against ``bf16`` on the same prompts (exact McNemar p);
* ``bits_int2`` — bits per K/V element of the INT2 region (codes + fp16 scale/zero,
  :class:`~oscar_kernels.spec.CacheSpec`), and ``bits@C`` — a whole ``C``-token cache with
  its BF16 windows (KIVI: its fp16 residual, :func:`~oscar_kernels.calibration.kivi.kivi_bits`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..errors import expect
from ..rotation import RotationArtifact
from ..spec import DEFAULT_K_CLIP, DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE, DEFAULT_V_CLIP

log = logging.getLogger(__name__)

BASELINE = "bf16"
BUILTIN_METHODS = ("bf16", "naive", "hadamard", "kivi", "oscar")
CLIP_POLICIES = ("fixed", "searched")
#: artifact ``method`` field -> row name
METHOD_NAMES = {"identity": "naive"}


# ------------------------------------------------------------------------ methods
@dataclass
class Method:
    """One row of the table: how K/V are stored and read.

    ``kind`` is ``"bf16"``, ``"int2"`` (format v1, needs ``artifact``) or ``"kivi"``;
    ``clip`` is ``"fixed"``, ``"searched"`` or ``"none"``.
    """

    name: str
    kind: str
    clip: str = "none"
    artifact: RotationArtifact | None = None
    source: str = "-"
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    group_size: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.kind != "int2" else f"{self.name} ({self.clip} clip)"

    def scheme(self):
        """The :class:`Int2Scheme` of an ``int2`` method (fixed policy: clips overridden)."""
        from ..integrations.transformers import Int2Scheme

        expect(self.kind == "int2", "method.kind", "'int2'", self.kind)
        clip = ({"k_clip": DEFAULT_K_CLIP, "v_clip": DEFAULT_V_CLIP} if self.clip == "fixed"
                else {})
        return Int2Scheme.from_artifact(self.artifact, sink_size=self.sink_size,
                                        recent_size=self.recent_size,
                                        group_size=self.group_size, **clip)

    def rules(self, num_layers: int):
        """Per-layer emulation rules (``None`` for ``bf16``)."""
        if self.kind == "bf16":
            return None
        if self.kind == "kivi":
            from .kivi import kivi_rules

            return kivi_rules(num_layers)
        return self.scheme().rules(num_layers)

    def clip_ratios(self) -> tuple[list[float], list[float]] | None:
        if self.kind != "int2":
            return None
        if self.clip == "fixed":
            n = len(self.artifact.layers)
            return [DEFAULT_K_CLIP] * n, [DEFAULT_V_CLIP] * n
        return ([float(lr.k_clip) for lr in self.artifact.layers],
                [float(lr.v_clip) for lr in self.artifact.layers])

    def bits(self, fingerprint, seq_len: int | None = None) -> float:
        """Bits per K/V element: INT2 region (``seq_len=None``) or a whole cache."""
        if self.kind == "bf16":
            return 16.0
        if self.kind == "kivi":
            from .kivi import kivi_bits

            return kivi_bits(seq_len)
        from ..spec import CacheSpec

        spec = CacheSpec(num_kv_heads=fingerprint.num_kv_heads, head_dim=fingerprint.head_dim,
                         page_size=1, group_size=self.group_size or fingerprint.head_dim,
                         sink_size=self.sink_size, recent_size=self.recent_size)
        if seq_len is None:
            return 8.0 * spec.int2_bytes_per_token / (2 * spec.num_kv_heads * spec.head_dim)
        return spec.effective_bits(seq_len)


def artifact_clip_policy(art: RotationArtifact) -> str:
    """``"searched"`` when the artifact says its clips were searched
    (``provenance["clip_policy"] == "search"``), ``"fixed"`` otherwise."""
    pol = str(art.provenance.get("clip_policy", "")).lower()
    return "searched" if pol in ("search", "searched") else "fixed"


def parse_rotation_arg(text: str) -> tuple[str | None, str]:
    """``"NAME=PATH"`` → ``(NAME, PATH)``; ``"PATH"`` → ``(None, PATH)``."""
    if "=" in text and not os.path.exists(text):
        name, path = text.split("=", 1)
        expect(bool(name) and bool(path), "--rotations", "PATH or NAME=PATH", text)
        return name, path
    return None, text


def load_rotations(specs: Sequence[str], fingerprint) -> dict[str, tuple[RotationArtifact, str]]:
    """Load ``--rotations`` entries (``PATH`` or ``NAME=PATH``; a directory loads every
    ``*.safetensors`` in it), check each against the model; name defaults to the
    artifact's method (``identity`` → ``naive``)."""
    out: dict[str, tuple[RotationArtifact, str]] = {}
    for text in specs:
        name, path = parse_rotation_arg(text)
        paths = ([os.path.join(path, f) for f in sorted(os.listdir(path))
                  if f.endswith(".safetensors")] if os.path.isdir(path) else [path])
        expect(len(paths) > 0, "--rotations", "a file or a directory with .safetensors files",
               path)
        for p in paths:
            art = RotationArtifact.load(p)
            art.check_model(fingerprint)
            n = name if (name and len(paths) == 1) else METHOD_NAMES.get(art.method, art.method)
            if name and len(paths) > 1:
                n = f"{name}/{n}"
            expect(n not in out, "--rotations", "distinct names", n)
            out[n] = (art, os.path.abspath(p))
    return out


def build_methods(fingerprint, rotations: dict[str, tuple[RotationArtifact, str]],
                  methods: Sequence[str], clips: Sequence[str], *,
                  sink_size: int = DEFAULT_SINK_SIZE, recent_size: int = DEFAULT_RECENT_SIZE,
                  group_size: int | None = None) -> tuple[list[Method], list[str]]:
    """Rows for ``methods`` (built-in names and/or names of loaded rotations) under
    ``clips``. Returns the rows and notes on rows that could not be built.

    ``naive``/``hadamard`` need no artifact for the fixed policy; a searched row needs
    an artifact whose clips were searched. ``oscar`` (and any other rotation) needs an
    artifact.
    """
    expect(len(methods) > 0, "--methods", "at least one method", list(methods))
    for c in clips:
        expect(c in CLIP_POLICIES, "--clip", f"values in {CLIP_POLICIES}", c)
    from ..rotation import RotationArtifact as RA

    kw = dict(sink_size=sink_size, recent_size=recent_size, group_size=group_size)
    rows: list[Method] = []
    notes: list[str] = []
    names = list(dict.fromkeys(list(methods)))
    for name in names:
        if name == "bf16":
            rows.append(Method("bf16", "bf16"))
            continue
        if name == "kivi":
            rows.append(Method("kivi", "kivi", "none", source="KIVI-2 (emulated)"))
            continue
        art, src = rotations.get(name, (None, None))
        for clip in clips:
            if art is not None and (clip == "fixed" or artifact_clip_policy(art) == "searched"):
                rows.append(Method(name, "int2", clip, art, src, **kw))
            elif art is None and clip == "fixed" and name in ("naive", "hadamard"):
                built = (RA.identity(fingerprint) if name == "naive"
                         else RA.hadamard(fingerprint))
                rows.append(Method(name, "int2", clip, built, "built-in", **kw))
            elif art is None:
                notes.append(f"{name} ({clip} clip): no rotation artifact given "
                             f"(--rotations {name}=PATH)")
            else:
                notes.append(f"{name} ({clip} clip): artifact {src} has fixed clips; make one "
                             "with `oscar-kv calibrate --clip search`")
    return rows, notes


# ---------------------------------------------------------------------- scoring
def _logits(model, ids: torch.Tensor, method: Method, num_layers: int) -> torch.Tensor:
    from ..integrations.transformers import attach_scheme

    rules = method.rules(num_layers)
    with torch.no_grad():
        if rules is None:
            return model(ids, use_cache=False).logits[0].float()
        with attach_scheme(model, rules):
            return model(ids, use_cache=False).logits[0].float()


def method_logits(model, ids: torch.Tensor, method: Method) -> torch.Tensor:
    """Teacher-forced logits ``[L, vocab]`` float32 of ``ids [1, L]`` under ``method``."""
    from ..integrations.transformers import model_fingerprint

    expect(ids.dim() == 2 and ids.shape[0] == 1, "ids", "a [1, L] tensor", ids)
    return _logits(model, ids, method, model_fingerprint(model.config).num_layers)


@dataclass
class _Acc:
    nll: dict = field(default_factory=dict)      # region -> [sum, count]
    kl_sum: float = 0.0
    top1: int = 0
    count: int = 0
    seconds: float = 0.0

    def add(self, region: str, s: float, n: int) -> None:
        a = self.nll.setdefault(region, [0.0, 0])
        a[0] += s
        a[1] += n


def _regions(contexts: Sequence[int], tail_start: int) -> dict[str, tuple[int, int]]:
    """Predicted-token ranges ``[lo, hi)`` per reported region."""
    out = {}
    for c in contexts:
        out[f"ppl@{c}"] = (1, c)
        if c > tail_start:
            out[f"tail_ppl@{c}"] = (tail_start, c)
    return out


def score_window(logits: torch.Tensor, ids: torch.Tensor, regions: dict, acc: _Acc,
                 ref_logp: torch.Tensor | None, tail: tuple[int, int],
                 chunk: int = 256) -> None:
    """Accumulate NLL per region and, against ``ref_logp`` (bf16 log-probs ``[L, V]``),
    KL and top-1 agreement over predicted tokens ``tail = [lo, hi)``."""
    target = ids[0, 1:]
    logp = torch.log_softmax(logits[:-1], dim=-1)
    nll = -logp.gather(1, target[:, None])[:, 0].double()     # nll[j] predicts token j+1
    for name, (lo, hi) in regions.items():
        acc.add(name, float(nll[lo - 1:hi - 1].sum()), hi - lo)
    if ref_logp is not None:
        lo, hi = tail
        for a in range(lo - 1, hi - 1, chunk):
            b = min(a + chunk, hi - 1)
            r, m = ref_logp[a:b], logp[a:b]
            acc.kl_sum += float((r.exp() * (r - m)).sum(dim=-1).double().sum())
            acc.top1 += int((r.argmax(-1) == m.argmax(-1)).sum())
            acc.count += b - a


def eval_windows(heldout_ids: torch.Tensor, ctx: int, num_windows: int) -> list[torch.Tensor]:
    """Consecutive non-overlapping ``[1, ctx]`` windows from the held-out stream."""
    n = min(num_windows, heldout_ids.numel() // ctx)
    expect(n >= 1, "held-out text", f"at least {ctx} tokens (one window)", heldout_ids.numel())
    if n < num_windows:
        log.warning("held-out text holds %d windows of %d tokens, not %d", n, ctx, num_windows)
    return [heldout_ids[i * ctx:(i + 1) * ctx][None] for i in range(n)]


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    if tqdm is None or not enabled:
        class _Null:
            def update(self, n=1): ...
            def set_postfix_str(self, s): ...
            def close(self): ...
        return _Null()
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


def run_perplexity(model, methods: Sequence[Method], windows: Sequence[torch.Tensor], *,
                   contexts: Sequence[int], tail_start: int = 512,
                   progress: bool = True) -> dict[str, dict]:
    """Perplexity, tail perplexity, KL and top-1 of every method over ``windows``.

    Returns ``{label: {"ppl@C": ..., "tail_ppl@C": ..., "kl": ..., "top1": ...,
    "tokens": {...}, "seconds": ...}}``.
    """
    from ..integrations.transformers import model_fingerprint

    num_layers = model_fingerprint(model.config).num_layers
    ctx = max(contexts)
    expect(all(w.shape[1] == ctx for w in windows), "windows", f"[1, {ctx}] tensors",
           [tuple(w.shape) for w in windows])
    expect(tail_start < ctx, "tail_start", f"< the longest context {ctx}", tail_start)
    regions = _regions(contexts, tail_start)
    accs = {m.label: _Acc() for m in methods}
    base = next((m for m in methods if m.kind == "bf16"), Method("bf16", "bf16"))
    bar = _progress(len(windows) * len(methods), "perplexity", progress)
    for w in windows:
        t0 = time.perf_counter()
        ref = _logits(model, w, base, num_layers)
        ref_sec = time.perf_counter() - t0
        ref_logp = torch.log_softmax(ref[:-1], dim=-1)
        for m in methods:
            bar.set_postfix_str(m.label)
            if m.kind == "bf16":
                logits, sec = ref, ref_sec
            else:
                t0 = time.perf_counter()
                logits = _logits(model, w, m, num_layers)
                sec = time.perf_counter() - t0
            acc = accs[m.label]
            score_window(logits, w, regions, acc, ref_logp, (tail_start, ctx))
            acc.seconds += sec
            bar.update(1)
            del logits
        del ref, ref_logp
    bar.close()
    out = {}
    for m in methods:
        a = accs[m.label]
        row = {k: math.exp(s / n) for k, (s, n) in a.nll.items()}
        row["kl"] = a.kl_sum / max(a.count, 1)
        row["top1"] = a.top1 / max(a.count, 1)
        row["tokens"] = {k: n for k, (s, n) in a.nll.items()}
        row["seconds"] = round(a.seconds, 2)
        out[m.label] = row
    return out


def run_passkey(model, tokenizer, methods: Sequence[Method], *, lengths: Sequence[int],
                depths: Sequence[float], seed: int = 0, keys_per_cell: int = 1,
                trial_stride: int = 1, cache: str = "emulated",
                progress: bool = True) -> dict[str, dict]:
    """Passkey accuracy of every method over the same ``lengths x depths x keys_per_cell``
    trials (every ``trial_stride``-th of them: with ``trial_stride == keys_per_cell``, the
    first key of every cell, a subset of the full grid's prompts).

    ``cache="emulated"``: INT2 and KIVI methods decode with a ``DynamicCache`` and the
    teacher-forced rule; ``"packed"``: INT2 methods decode through the real
    :class:`OscarCache` (KIVI stays emulated). ``bf16`` always uses a ``DynamicCache``.

    Returns ``{label: {"accuracy", "correct", "n", "ci95": [lo, hi], "by_length":
    {length: [correct, n]}, "trials": [...], "seconds"}}`` (Wilson 95% interval,
    :func:`~oscar_kernels.calibration.passkey.summarize`).
    """
    from transformers import DynamicCache

    from ..integrations.transformers import OscarCache, attach_scheme, model_fingerprint
    from .passkey import make_trials, run_trial, summarize

    expect(cache in ("emulated", "packed"), "passkey cache", "'emulated' or 'packed'", cache)
    fp = model_fingerprint(model.config)
    expect(isinstance(trial_stride, int) and trial_stride >= 1, "trial_stride",
           "a positive int", trial_stride)
    trials = make_trials(tokenizer, lengths, depths, seed=seed,
                         keys_per_cell=keys_per_cell)[::trial_stride]
    bar = _progress(len(trials) * len(methods), "passkey", progress)
    out = {}
    for m in methods:
        bar.set_postfix_str(m.label)
        t0 = time.perf_counter()
        results = []
        rules = m.rules(fp.num_layers)
        if m.kind == "int2" and cache == "packed":
            scheme = m.scheme()
            make = lambda n, s=scheme: OscarCache(model.config, s, max_cache_len=n)  # noqa: E731
        else:
            make = lambda n: DynamicCache(config=model.config)  # noqa: E731
        ctx = attach_scheme(model, rules) if rules is not None else _nullcontext()
        with ctx, torch.no_grad():
            for tr in trials:
                results.append(run_trial(model, tokenizer, tr, make))
                bar.update(1)
        out[m.label] = dict(summarize([r.correct for r in results],
                                      [r.length for r in results]),
                            trials=[r.to_dict() for r in results],
                            seconds=round(time.perf_counter() - t0, 2))
    bar.close()
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------------- report
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
    fig.savefig(path, dpi=110)
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
        lines += [f"Merged from {len(meta['parts'])} runs (`results/eval/merge_parts.py`): "
                  + "; ".join(f"`{p['dir']}` ({p['seconds_total']:.0f} s, {p['date']})"
                              for p in meta["parts"]) + ".", ""]
    lines += [f"Wall time {meta.get('seconds_total', 0):.0f} s on {meta['environment']['cpu_count']}"
              f" CPU(s), {meta['environment']['threads']} torch threads, load average at start "
              f"{meta['environment'].get('loadavg_start')}; {meta.get('date', '')}.", ""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    with open(js_path, "w") as f:
        json.dump({"meta": meta, "rows": list(rows), "notes": list(notes)}, f, indent=1,
                  default=str)
    plot(rows, contexts, tail_start, png_path, title=meta.get("model_name", ""))
    return md_path, js_path, png_path
