"""Passkey: prompts are built as specified, generation is greedy and deterministic, and
the packed cache decodes exactly what the emulation decodes."""

import pytest
import torch

from evalhelpers import CharTokenizer, tiny_llama
from helpers import random_rotation
from oscar_kernels.evaluation.methods import Method
from oscar_kernels.evaluation.metrics import run_passkey
from oscar_kernels.evaluation.passkey import (FILLER, NEEDLE, build_trial, greedy_generate,
                                               make_trials, mcnemar_p, paired_comparison,
                                               parse_answer, run_trial, summarize,
                                               wilson_interval)
from oscar_kernels.integrations.transformers import Int2Scheme, OscarCache, attach_scheme
from oscar_kernels.rotation import RotationArtifact

pytest.importorskip("transformers")


def test_prompt_layout():
    tok = CharTokenizer()
    tr = build_trial(tok, 1200, 0.5, "31415", max_new_tokens=8)
    assert tr.num_tokens <= 1200 - 8 and tr.num_tokens > 1200 - 8 - len(FILLER)
    text = tok.decode(tr.input_ids.tolist())
    needle = NEEDLE.format(key="31415")
    at = text.index(needle)
    before = text[:at].count(FILLER)
    after = text[at:].count(FILLER)
    assert abs(before - after) <= 1 and tr.input_ids[0] == tok.bos_token_id
    assert build_trial(tok, 1200, 0.0, "1").input_ids.tolist().index(
        tok("T")["input_ids"][0]) > 0
    a = make_trials(tok, [600, 800], [0.1, 0.9], seed=3)
    b = make_trials(tok, [600, 800], [0.1, 0.9], seed=3)
    assert [t.key for t in a] == [t.key for t in b] and len({t.key for t in a}) > 1
    assert all(len(t.key) == 5 for t in a)
    with pytest.raises(ValueError, match="length"):
        build_trial(tok, 100, 0.5, "12345")
    with pytest.raises(ValueError, match="depth"):
        build_trial(tok, 1200, 1.5, "12345")


def test_parse_answer():
    assert parse_answer(" 12345.") == "12345"
    assert parse_answer(" the key is 42 and 7") == "42"
    assert parse_answer(" none") is None


def test_greedy_generation_is_deterministic_and_cache_independent(gen):
    from transformers import DynamicCache

    model = tiny_llama(seed=6, max_positions=1024)
    tok = CharTokenizer()
    trial = make_trials(tok, [400], [0.5], seed=1)[0]
    ids = trial.input_ids[None]
    with torch.no_grad():
        a = greedy_generate(model, ids, 6, DynamicCache(config=model.config))
        b = greedy_generate(model, ids, 6, DynamicCache(config=model.config))
        # greedy = argmax of the full teacher-forced forward
        c = []
        cur = ids
        for _ in range(6):
            nxt = int(model(cur).logits[0, -1].argmax())
            c.append(nxt)
            cur = torch.cat([cur, torch.tensor([[nxt]])], 1)
    assert a == b == c
    layers = [random_rotation(2, 16, gen) for _ in range(2)]
    scheme = Int2Scheme(layers, sink_size=8, recent_size=32, page_size=16)
    with torch.no_grad(), attach_scheme(model, scheme):
        emu = greedy_generate(model, ids, 6, DynamicCache(config=model.config))
        packed = greedy_generate(model, ids, 6, OscarCache(model.config, scheme,
                                                           max_cache_len=ids.shape[1] + 6))
    assert emu == packed
    r1 = run_trial(model, tok, trial, lambda n: DynamicCache(config=model.config))
    r2 = run_trial(model, tok, trial, lambda n: DynamicCache(config=model.config))
    assert r1 == r2 and r1.correct == (r1.answer == trial.key)


def test_run_passkey_reports_every_method():
    model = tiny_llama(seed=7, max_positions=1024)
    tok = CharTokenizer()
    from oscar_kernels.integrations.transformers import model_fingerprint

    fp = model_fingerprint(model.config)
    methods = [Method("bf16", "bf16"), Method("kivi", "kivi"),
               Method("hadamard", "int2", "fixed", RotationArtifact.hadamard(fp),
                      sink_size=8, recent_size=32)]
    out_e = run_passkey(model, tok, methods, lengths=[420], depths=[0.5], cache="emulated",
                        progress=False)
    out_p = run_passkey(model, tok, methods, lengths=[420], depths=[0.5], cache="packed",
                        progress=False)
    assert set(out_e) == {"bf16", "kivi", "hadamard (fixed clip)"}
    for k in out_e:
        assert 0.0 <= out_e[k]["accuracy"] <= 1.0
        assert [t["generated"] for t in out_e[k]["trials"]] == \
               [t["generated"] for t in out_p[k]["trials"]]


def test_trial_grid_keys_per_cell_is_deterministic():
    tok = CharTokenizer()
    one = make_trials(tok, [600, 800], [0.1, 0.5, 0.9], seed=11)
    three = make_trials(tok, [600, 800], [0.1, 0.5, 0.9], seed=11, keys_per_cell=3)
    again = make_trials(tok, [600, 800], [0.1, 0.5, 0.9], seed=11, keys_per_cell=3)
    assert len(one) == 6 and len(three) == 18
    assert [(t.length, t.depth, t.key) for t in three] == \
           [(t.length, t.depth, t.key) for t in again]
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(three, again))
    # order: length, depth, key; the first key drawn is the one-key grid's first key
    assert [(t.length, t.depth) for t in three[:3]] == [(600, 0.1)] * 3
    assert three[0].key == one[0].key
    for c in range(6):
        cell = three[3 * c:3 * c + 3]
        assert len({t.key for t in cell}) == 3 and len({(t.length, t.depth) for t in cell}) == 1
    assert [t.key for t in make_trials(tok, [600], [0.5], seed=12, keys_per_cell=3)] != \
           [t.key for t in three[:3]]
    with pytest.raises(ValueError, match="keys_per_cell"):
        make_trials(tok, [600], [0.5], keys_per_cell=0)


def test_wilson_interval_solves_the_score_equation():
    import random

    rng = random.Random(5)
    z = 1.959963984540054
    assert wilson_interval(9, 10) == pytest.approx((0.5958, 0.9821), abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    for _ in range(200):
        n = rng.randrange(1, 300)
        k = rng.randrange(0, n + 1)
        lo, hi = wilson_interval(k, n)
        p = k / n
        assert 0.0 <= lo <= p <= hi <= 1.0
        # each finite bound is a root of (p_hat - p)^2 = z^2 p (1 - p) / n
        for b in (lo, hi):
            if 0.0 < b < 1.0:
                assert (p - b) ** 2 == pytest.approx(z * z * b * (1 - b) / n, rel=1e-9, abs=1e-12)
        # symmetric under swapping successes and failures
        lo2, hi2 = wilson_interval(n - k, n)
        assert (lo, hi) == pytest.approx((1 - hi2, 1 - lo2), abs=1e-12)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="n"):
        wilson_interval(0, 0)


def test_paired_comparison_and_mcnemar_against_enumeration():
    import math
    import random

    rng = random.Random(8)
    for _ in range(50):
        n = rng.randrange(1, 40)
        a = [rng.random() < 0.6 for _ in range(n)]
        b = [rng.random() < 0.7 for _ in range(n)]
        cmp = paired_comparison(a, b)
        assert cmp["lost"] == sum(1 for x, y in zip(a, b) if y and not x)
        assert cmp["won"] == sum(1 for x, y in zip(a, b) if x and not y)
        s = summarize(a, [600 + 200 * (i % 2) for i in range(n)])
        assert s["correct"] == sum(a) and s["n"] == n and s["accuracy"] == sum(a) / n
        assert s["ci95"] == list(wilson_interval(sum(a), n))
        assert sum(v[1] for v in s["by_length"].values()) == n
    # exact McNemar: the probability, under a fair coin on the discordant pairs, of an
    # outcome at most as likely as the observed one (equal tails), by enumeration
    for lost, won in [(0, 0), (5, 0), (3, 7), (10, 9), (0, 12)]:
        m = lost + won
        probs = [math.comb(m, i) / 2 ** m for i in range(m + 1)]
        k = min(lost, won)
        want = min(1.0, sum(p for i, p in enumerate(probs) if min(i, m - i) <= k))
        if m and lost == won:
            want = 1.0
        assert mcnemar_p(lost, won) == pytest.approx(want, rel=1e-12)
        assert mcnemar_p(lost, won) == mcnemar_p(won, lost)
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)
    with pytest.raises(ValueError, match="correct/baseline"):
        paired_comparison([True], [True, False])
