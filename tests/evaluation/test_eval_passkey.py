"""Passkey: prompts are built as specified, generation is greedy and deterministic, and
the packed cache decodes exactly what the emulation decodes."""

import pytest
import torch

from evalhelpers import CharTokenizer, tiny_llama
from helpers import random_rotation
from oscar_kernels.calibration.evaluate import Method, run_passkey
from oscar_kernels.calibration.passkey import (FILLER, NEEDLE, build_trial, greedy_generate,
                                               make_trials, parse_answer, run_trial)
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
