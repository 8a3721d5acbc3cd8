"""What a method does to the model: perplexity, tail perplexity, KL, top-1, passkey.

Token ``p`` of a window is predicted from positions ``< p``. Per method:

* ``ppl@C``: perplexity of tokens ``1 <= p < C`` of each window (a ``C``-token context:
  the first ``C`` tokens of a longer window see exactly what a ``C``-token window would);
* ``tail_ppl@C``: the same over ``tail_start <= p < C`` (default 512), where most of the
  context is read from the INT2 region;
* ``kl``: mean ``KL(p_bf16 || p_method)`` (nats) of the next-token distributions over the
  tail positions of the longest context; ``top1``: fraction of those positions where the
  argmax agrees with ``bf16``;
* ``passkey``: retrieval accuracy (:mod:`oscar_kernels.evaluation.passkey`): greedy
  decoding through a cache (``DynamicCache`` + emulation by default, or the real packed
  :class:`~oscar_kernels.integrations.transformers.OscarCache`), over a
  lengths x depths x keys grid, with a Wilson 95% interval.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..errors import expect
from .methods import Method

log = logging.getLogger(__name__)


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
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", disable=not enabled, dynamic_ncols=True)


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
    :func:`~oscar_kernels.evaluation.passkey.summarize`).
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
        ctx = attach_scheme(model, rules) if rules is not None else contextlib.nullcontext()
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
