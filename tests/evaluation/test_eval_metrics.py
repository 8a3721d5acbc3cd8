"""Evaluation on a tiny random Llama: bf16 is the unmodified model, the metrics mean what
they say, the outputs are written, bad inputs raise typed errors."""

import argparse
import json
import math
import os

import pytest
import torch

from evalhelpers import tiny_llama
from oscar_kernels import RotationArtifact
from oscar_kernels.evaluation import eval_cmd
from oscar_kernels.evaluation.methods import Method, build_methods, load_rotations
from oscar_kernels.evaluation.metrics import method_logits, run_perplexity
from oscar_kernels.evaluation.report import build_rows, markdown_table, write_outputs
from oscar_kernels.integrations.transformers import model_fingerprint

pytest.importorskip("transformers")


def test_bf16_method_reproduces_the_unmodified_model_exactly(gen):
    model = tiny_llama(seed=4)
    ids = torch.randint(0, 96, (1, 50), generator=gen)
    with torch.no_grad():
        want = model(ids).logits[0]
    got = method_logits(model, ids, Method("bf16", "bf16"))
    assert torch.equal(got, want)
    # and an INT2 method does change them, then leaves the model unmodified
    fp = model_fingerprint(model.config)
    naive = Method("naive", "int2", "fixed", RotationArtifact.identity(fp), sink_size=2,
                   recent_size=4)
    assert not torch.equal(method_logits(model, ids, naive), want)
    assert torch.equal(method_logits(model, ids, Method("bf16", "bf16")), want)


def _methods(fp, tmp_path):
    art = RotationArtifact.hadamard(fp)
    art.layers[0].k_clip = 0.8
    art.provenance["clip_policy"] = "search"
    path = tmp_path / "had.safetensors"
    art.save(path)
    rot = load_rotations([f"hadamard={path}"], fp)
    return build_methods(fp, rot, ["bf16", "naive", "hadamard", "kivi", "oscar"],
                         ["fixed", "searched"], sink_size=4, recent_size=8)


def test_rows_and_notes(tmp_path):
    fp = model_fingerprint(tiny_llama().config)
    rows, notes = _methods(fp, tmp_path)
    labels = [m.label for m in rows]
    assert labels == ["bf16", "naive (fixed clip)", "hadamard (fixed clip)",
                      "hadamard (searched clip)", "kivi"]
    assert any("naive (searched clip)" in n for n in notes)
    assert sum("oscar" in n for n in notes) == 2
    had_fixed, had_search = rows[2], rows[3]
    assert had_fixed.clip_ratios()[0][0] == 0.96 and had_search.clip_ratios()[0][0] == 0.8
    assert had_fixed.scheme().layers[0].k_clip == 0.96
    assert had_search.scheme().layers[0].k_clip == 0.8
    # bits: D = 16, G = D, fp16 scale+zero: 2 + 32 / 16 = 4 bits in the INT2 region
    assert had_fixed.bits(fp) == 4.0
    assert rows[0].bits(fp) == 16.0 and rows[4].bits(fp) == 3.0


def test_perplexity_kl_top1_and_outputs(tmp_path, gen):
    model = tiny_llama(seed=5)
    fp = model_fingerprint(model.config)
    methods, notes = _methods(fp, tmp_path)
    windows = [torch.randint(0, 96, (1, 64), generator=gen) for _ in range(2)]
    ppl = run_perplexity(model, methods, windows, contexts=[32, 64], tail_start=16,
                         progress=False)
    base = ppl["bf16"]
    assert base["kl"] == pytest.approx(0.0, abs=1e-6) and base["top1"] == 1.0
    assert base["tokens"] == {"ppl@32": 62, "tail_ppl@32": 32, "ppl@64": 126,
                              "tail_ppl@64": 96}
    # independent check of the baseline perplexity on the first 32 tokens of each window
    nll = []
    with torch.no_grad():
        for w in windows:
            lp = torch.log_softmax(model(w[:, :32]).logits[0, :-1], -1)
            nll.append(-lp.gather(1, w[0, 1:32, None])[:, 0])
    assert base["ppl@32"] == pytest.approx(math.exp(float(torch.cat(nll).mean())), rel=1e-5)
    for label, row in ppl.items():
        if label != "bf16":
            assert row["kl"] > 0 and 0 <= row["top1"] <= 1
    rows = build_rows(methods, ppl, None, fp, [32, 64], 16)
    assert rows[1]["tail_ppl@64_vs_bf16_pct"] == pytest.approx(
        100 * (rows[1]["tail_ppl@64"] / base["tail_ppl@64"] - 1))
    table = markdown_table(rows, [32, 64], 16)
    assert table.count("\n") == len(rows) + 1 and "hadamard | searched" in table
    meta = {"model_name": "tiny", "command": "test", "windows": 2, "environment":
            {"cpu_count": 1, "threads": 1}, "seconds_total": 1.0}
    md, js, png = write_outputs(str(tmp_path / "out"), rows, meta, [32, 64], 16, notes)
    assert os.path.getsize(png) > 1000
    data = json.load(open(js))
    assert [r["label"] for r in data["rows"]] == [m.label for m in methods]
    text = open(md).read()
    assert "naive (searched clip)" in text
    assert "Passkey: not run." in text and "lengths None" not in text
    meta.update(heldout="a.txt, b.txt", heldout_tokens=1000, passkey_lengths=[64],
                passkey_depths=[0.5], passkey_keys_per_cell=2, passkey_cache="emulated")
    md, _, _ = write_outputs(str(tmp_path / "out2"), rows, meta, [32, 64], 16, notes)
    text = open(md).read()
    assert "its first 128 of 1,000 tokens" in text and "Passkey: lengths [64]" in text


def _eval_args(argv):
    p = argparse.ArgumentParser()
    eval_cmd.add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("argv, max_positions", [
    (["--ctx", "4096"], 2048),
    (["--passkey-lengths", "9000"], 8192),
])
def test_lengths_beyond_the_model_name_the_argument(argv, max_positions):
    with pytest.raises(ValueError, match=argv[0]):
        eval_cmd.check_model_limits(_eval_args(argv), max_positions)
    eval_cmd.check_model_limits(_eval_args(argv), None)     # no limit known: no check


@pytest.mark.parametrize("argv", [["--contexts", "3000"], ["--tail-start", "2048"]])
def test_arguments_that_disagree_name_the_argument(argv):
    with pytest.raises(ValueError, match=argv[0]):
        eval_cmd.check_args(_eval_args(argv))


def test_cli_default_contexts():
    assert eval_cmd.contexts_of(_eval_args([])) == [1024, 2048]
    assert eval_cmd.contexts_of(_eval_args(["--ctx", "512"])) == [512]


def test_demo_forwards_its_passkey_grid_to_eval():
    from oscar_kernels.evaluation import demo_cmd

    p = argparse.ArgumentParser()
    demo_cmd.add_arguments(p)
    demo = p.parse_args(["--passkey-keys", "3", "--passkey-depths", "0.2", "--windows", "3",
                         "--out-dir", "x"])
    demo_cmd.check_args(demo)
    args = _eval_args(demo_cmd.eval_argv(demo, "rot/"))
    assert (args.passkey_keys, args.passkey_depths, args.windows) == (3, [0.2], 3)
    assert args.rotations == ["rot/"] and args.passkey_lengths == [1024, 1536]
    assert args.out_dir == "x"


def test_demo_full_takes_the_published_size_and_explicit_flags_win():
    from oscar_kernels.evaluation import demo_cmd

    p = argparse.ArgumentParser()
    demo_cmd.add_arguments(p)
    full = p.parse_args(["--full", "--passkey-keys", "1"])
    demo_cmd.check_args(full)
    assert full.windows == 6 and full.passkey_keys == 1
    assert full.passkey_lengths == [768, 1024, 1280, 1536]
    assert len(full.passkey_depths) == 5


def test_rotation_for_another_model_is_rejected(tmp_path):
    from oscar_kernels.errors import ArtifactError
    from oscar_kernels.rotation import ModelFingerprint

    fp = model_fingerprint(tiny_llama().config)
    other = RotationArtifact.hadamard(ModelFingerprint(3, 2, 4, 16))
    other.save(tmp_path / "o.safetensors")
    with pytest.raises(ArtifactError, match="another model"):
        load_rotations([str(tmp_path / "o.safetensors")], fp)
