"""Passkey retrieval: a number hidden in filler text, recalled by greedy decoding.

The prompt (token ids, built piece by piece so its length is exact up to one filler
sentence) is an instruction, ``n`` repetitions of a filler paragraph with the needle
``"The pass key is 12345. Remember it. 12345 is the pass key."`` inserted after
``round(depth * n)`` of them, and the question ``"What is the pass key? The pass key
is"``. The model continues greedily (argmax, no sampling: deterministic); the answer is
the first run of digits in the continuation, correct when it equals the key.

A grid of trials is ``lengths x depths x keys_per_cell`` prompts whose keys come from one
seeded generator (:func:`make_trials`), so every method sees the same prompts. Accuracy
is reported with a Wilson score interval (:func:`wilson_interval`), and methods are
compared with the baseline trial by trial (:func:`paired_comparison`: the trials one gets
right and the other misses, with an exact two-sided McNemar p-value), which is what
separates two methods measured on the same prompts far better than two overlapping
intervals.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from ..errors import expect

log = logging.getLogger(__name__)

INTRO = ("There is an important piece of information hidden inside a lot of irrelevant "
         "text. Find it and memorize it. I will quiz you about the important information "
         "there.\n\n")
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and "
          "back again. ")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\n\nWhat is the pass key? The pass key is"
DEFAULT_DIGITS = 5


@dataclass(frozen=True)
class PasskeyTrial:
    """One prompt: target ``length`` (tokens), needle ``depth`` in [0, 1], the ``key``."""

    length: int
    depth: float
    key: str
    input_ids: torch.Tensor  # [N] int64, N <= length

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


@dataclass
class PasskeyResult:
    length: int
    depth: float
    num_tokens: int
    key: str
    answer: str | None
    generated: str
    correct: bool

    def to_dict(self) -> dict:
        return asdict(self)


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, return_attention_mask=False,
                          verbose=False)["input_ids"])


def build_trial(tokenizer, length: int, depth: float, key: str, *,
                max_new_tokens: int = 8) -> PasskeyTrial:
    """A prompt of at most ``length - max_new_tokens`` tokens with ``key`` at ``depth``.

    Raises
    ------
    ValueError
        ``length`` too short for the instruction, needle, question and one filler.
    """
    expect(0.0 <= float(depth) <= 1.0, "depth", "a float in [0, 1]", depth)
    expect(isinstance(key, str) and key.isdigit(), "key", "a string of digits", key)
    bos = getattr(tokenizer, "bos_token_id", None)
    head = ([bos] if bos is not None else []) + _ids(tokenizer, INTRO)
    filler = _ids(tokenizer, FILLER)
    needle = _ids(tokenizer, NEEDLE.format(key=key))
    tail = _ids(tokenizer, QUESTION)
    budget = length - max_new_tokens - len(head) - len(needle) - len(tail)
    n = budget // len(filler)
    expect(n >= 1, "length", f">= {length - budget + len(filler)} tokens (room for one filler "
           "paragraph)", length)
    before = int(round(float(depth) * n))
    ids = head + filler * before + needle + filler * (n - before) + tail
    return PasskeyTrial(int(length), float(depth), key, torch.tensor(ids, dtype=torch.int64))


def make_trials(tokenizer, lengths: Sequence[int], depths: Sequence[float], *, seed: int = 0,
                keys_per_cell: int = 1, num_digits: int = DEFAULT_DIGITS,
                max_new_tokens: int = 8) -> list[PasskeyTrial]:
    """``keys_per_cell`` trials per (length, depth), in the order length, depth, key.

    Keys are drawn from ``random.Random(seed)`` in that order (so every method sees the
    same prompts, and ``keys_per_cell=1`` reproduces the one-key grid of the same seed);
    the keys of one cell are distinct.
    """
    expect(len(lengths) > 0 and len(depths) > 0, "lengths/depths", "non-empty sequences",
           (list(lengths), list(depths)))
    expect(isinstance(keys_per_cell, int) and keys_per_cell >= 1, "keys_per_cell",
           "a positive int", keys_per_cell)
    expect(isinstance(num_digits, int) and 1 <= num_digits <= 12, "num_digits",
           "an int in [1, 12]", num_digits)
    rng = random.Random(seed)
    trials = []
    for length in lengths:
        for depth in depths:
            cell: list[str] = []
            while len(cell) < keys_per_cell:
                key = str(rng.randrange(10 ** (num_digits - 1), 10 ** num_digits))
                if key not in cell:
                    cell.append(key)
            for key in cell:
                trials.append(build_trial(tokenizer, int(length), float(depth), key,
                                          max_new_tokens=max_new_tokens))
    return trials


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for the default ``z``).

    ``(c - h, c + h) / (1 + z²/n)`` with ``c = p̂ + z²/(2n)`` and
    ``h = z·sqrt(p̂(1-p̂)/n + z²/(4n²))``; unlike the normal approximation it stays inside
    [0, 1] and is not degenerate at 0 or ``n`` successes.

    Raises
    ------
    ValueError
        ``n < 1`` or ``successes`` outside ``[0, n]``.
    """
    expect(isinstance(n, int) and n >= 1, "n", "a positive int", n)
    expect(isinstance(successes, int) and 0 <= successes <= n, "successes",
           f"an int in [0, {n}]", successes)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
    lo = 0.0 if successes == 0 else max(0.0, (centre - half) / denom)
    hi = 1.0 if successes == n else min(1.0, (centre + half) / denom)
    return lo, hi


def mcnemar_p(lost: int, won: int) -> float:
    """Exact two-sided McNemar p-value: ``lost`` and ``won`` discordant trials, under the
    null that each discordant trial goes either way with probability 1/2."""
    expect(isinstance(lost, int) and isinstance(won, int) and lost >= 0 and won >= 0,
           "lost/won", "non-negative ints", (lost, won))
    n = lost + won
    if n == 0:
        return 1.0
    k = min(lost, won)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def summarize(correct: Sequence[bool], lengths: Sequence[int] | None = None) -> dict:
    """Accuracy, count and Wilson 95% interval of a list of trial outcomes; with the
    trials' ``lengths``, also the accuracy per length (``{length: [correct, n]}``)."""
    n = len(correct)
    expect(n >= 1, "correct", "at least one trial", n)
    k = int(sum(bool(c) for c in correct))
    lo, hi = wilson_interval(k, n)
    out = {"accuracy": k / n, "correct": k, "n": n, "ci95": [lo, hi]}
    if lengths is not None:
        expect(len(lengths) == n, "lengths", f"{n} values (one per trial)", len(lengths))
        per: dict[int, list[int]] = {}
        for c, ln in zip(correct, lengths):
            a = per.setdefault(int(ln), [0, 0])
            a[0] += int(bool(c))
            a[1] += 1
        out["by_length"] = {str(k_): v for k_, v in sorted(per.items())}
    return out


def paired_comparison(correct: Sequence[bool], baseline: Sequence[bool]) -> dict:
    """Trial-by-trial comparison with the baseline on the same prompts: ``lost`` (baseline
    right, method wrong), ``won`` (the reverse) and the exact McNemar p-value."""
    expect(len(correct) == len(baseline) and len(correct) > 0, "correct/baseline",
           "two non-empty outcome lists of one length", (len(correct), len(baseline)))
    lost = sum(1 for c, b in zip(correct, baseline) if b and not c)
    won = sum(1 for c, b in zip(correct, baseline) if c and not b)
    return {"lost": lost, "won": won, "p_mcnemar": mcnemar_p(lost, won)}


def cache_kwarg(model) -> str:
    """Name of the cache argument of ``model.forward`` (``cache`` in transformers >= 5.x,
    ``past_key_values`` before)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.no_grad()
def greedy_generate(model, input_ids: torch.Tensor, max_new_tokens: int, cache,
                    stop: Callable[[list[int]], bool] | None = None) -> list[int]:
    """Greedy (argmax) continuation of ``input_ids [1, N]`` through ``cache`` (a
    ``transformers`` Cache: ``DynamicCache`` or :class:`OscarCache`).

    One prefill forward, then one token per forward; only the last position's logits
    are computed. Stops after ``max_new_tokens`` or when ``stop(tokens)`` is true.
    """
    expect(input_ids.dim() == 2 and input_ids.shape[0] == 1, "input_ids", "a [1, N] tensor",
           input_ids)
    kw = cache_kwarg(model)
    out: list[int] = []
    ids = input_ids
    for _ in range(max_new_tokens):
        logits = model(ids, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[:, -1]
        nxt = int(torch.argmax(logits, dim=-1)[0])
        out.append(nxt)
        if stop is not None and stop(out):
            break
        ids = torch.tensor([[nxt]], dtype=input_ids.dtype, device=input_ids.device)
    return out


_DIGITS = re.compile(r"\d+")


def parse_answer(text: str) -> str | None:
    """First run of digits in ``text`` (``None`` when there is none)."""
    m = _DIGITS.search(text)
    return m.group(0) if m else None


def _digits_done(tokenizer, num_digits: int):
    def stop(tokens: list[int]) -> bool:
        text = tokenizer.decode(tokens)
        m = _DIGITS.search(text)
        return m is not None and (len(m.group(0)) >= num_digits or m.end() < len(text))
    return stop


def run_trial(model, tokenizer, trial: PasskeyTrial, make_cache: Callable[[int], object], *,
              max_new_tokens: int = 8) -> PasskeyResult:
    """Generate the answer of one trial; ``make_cache(max_len)`` returns a fresh cache."""
    cache = make_cache(trial.num_tokens + max_new_tokens)
    device = next(model.parameters()).device
    tokens = greedy_generate(model, trial.input_ids[None].to(device), max_new_tokens, cache,
                             stop=_digits_done(tokenizer, len(trial.key)))
    text = tokenizer.decode(tokens)
    answer = parse_answer(text)
    return PasskeyResult(trial.length, trial.depth, trial.num_tokens, trial.key, answer, text,
                         answer == trial.key)
