"""``oscar-kv calibrate`` end to end on a tiny random model saved to disk; data helpers;
``-m slow``: the real SmolLM2-135M on a small token count."""

from __future__ import annotations

import json
import os

import pytest
import torch

from calib_models import tiny_model, tiny_tokenizer
from oscar_kernels.calibration import data
from oscar_kernels.cli import main
from oscar_kernels.rotation import RotationArtifact


def _text(n_chars: int, seed: int) -> str:
    gen = torch.Generator().manual_seed(seed)
    words = ["the", "king", "of", "denmark", "is", "dead", "long", "live", "queen", "and",
             "ghost", "night", "sword", "crown", "speak", "love", "fool", "storm", "sea"]
    idx = torch.randint(0, len(words), (n_chars // 4,), generator=gen).tolist()
    return " ".join(words[i] for i in idx)[:n_chars]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    model = tiny_model("qwen3", seed=1)
    model.save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    (d / "calib.txt").write_text(_text(4000, 1), encoding="utf-8")
    (d / "held.txt").write_text(_text(1500, 2), encoding="utf-8")
    return d


def _args(d, out, *extra):
    return ["calibrate", "--model", str(d), "--text", str(d / "calib.txt"),
            "--heldout-text", str(d / "held.txt"), "--tokens", "1500", "--chunk-len", "256",
            "--eval-ctx", "300", "--eval-sequences", "2", "--queries", "8",
            "--min-query-position", "100", "--sink-size", "8", "--recent-size", "32",
            "--out", str(out), "--no-progress", *extra]


def test_calibrate_cli_writes_artifacts_and_report(tiny_dir, tmp_path, capsys):
    out = tmp_path / "rot.safetensors"
    rc = main(_args(tiny_dir, out, "--out-dir", str(tmp_path / "all"), "--clip", "search",
                    "--report-variants", "all"))
    assert rc == 0
    art = RotationArtifact.load(out)
    assert art.method == "kv-cov" and art.per_head       # the shipped default recipe
    assert art.provenance["clip_policy"] == "search"
    assert art.provenance["calibration_tokens"] == 1500
    assert art.provenance["clip_search_cache"] == {"group_size": 16, "sink_size": 8,
                                                   "recent_size": 32}
    for lr in art.layers:
        assert min(0.8, 1.0) - 1e-9 <= lr.k_clip <= 1.0 and 0.8 - 1e-9 <= lr.v_clip <= 1.0
    for m in ("identity", "hadamard", "kv-cov", "oscar", "oscar-proxy", "auto"):
        assert RotationArtifact.load(tmp_path / "all" / f"{m}.safetensors").method == m
    rep = json.loads((tmp_path / "rot.report.json").read_text())
    names = set(rep["mean_error"])
    assert {"identity", "hadamard", "kv-cov", "oscar", "oscar/head", "auto"} <= names
    # auto picks, per layer, the candidate with the lowest search-buffer error
    for i, r in enumerate(rep["layers"]["auto"]):
        kname = r["source"].split()[0][2:]
        cands = [n for n in rep["layers"] if n not in ("identity", "auto")]
        best = min(rep["layers"][n][i]["search_k_error"] for n in cands)
        assert rep["layers"][kname][i]["search_k_error"] == best
    for name, pol in rep["mean_error"].items():
        assert set(pol) == {"none", "fixed", "search"}
        assert all(0.0 < v < 10.0 for v in pol.values()), (name, pol)
    assert rep["meta"]["peak_rss_mib"] > 0
    md = (tmp_path / "rot.report.md").read_text()
    assert "| oscar/head |" in md
    printed = capsys.readouterr().out
    assert "mean" in printed and "oscar/head" in printed


def test_calibrate_cli_fixed_clip_per_layer(tiny_dir, tmp_path):
    out = tmp_path / "r.safetensors"
    assert main(_args(tiny_dir, out, "--clip", "fixed", "--per-layer", "--method",
                      "kv-cov")) == 0
    art = RotationArtifact.load(out)
    assert art.method == "kv-cov" and not art.per_head
    assert {lr.k_clip for lr in art.layers} == {0.96}
    assert {lr.v_clip for lr in art.layers} == {0.92}


def test_calibrate_cli_clip_minimum(tiny_dir, tmp_path):
    out = tmp_path / "m.safetensors"
    assert main(_args(tiny_dir, out, "--k-clip-min", "1.0", "--v-clip-min", "0.9")) == 0
    art = RotationArtifact.load(out)
    assert {lr.k_clip for lr in art.layers} == {1.0}
    assert all(0.9 - 1e-9 <= lr.v_clip <= 1.0 for lr in art.layers)
    assert art.provenance["clip_search_min"] == {"k": 1.0, "v": 0.9}


@pytest.mark.parametrize("extra, code, needle", [
    (["--k-clip-min", "1.5"], 2, "--k-clip-min"),
    (["--tokens", "0"], 2, "--tokens"),
    (["--group-size", "12"], 1, "--group-size"),       # must divide head_dim: known at run
])
def test_calibrate_cli_rejects_bad_arguments(tiny_dir, tmp_path, capsys, extra, code, needle):
    assert main(_args(tiny_dir, tmp_path / "x.safetensors", *extra)) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith("oscar-kv: error: ") and needle in err and "\n" not in err
    assert not (tmp_path / "x.safetensors").exists()


def test_calibrate_cli_refuses_to_replace_an_artifact_without_force(tiny_dir, tmp_path,
                                                                    capsys):
    out = tmp_path / "r.safetensors"
    out.write_bytes(b"earlier artifact")
    assert main(_args(tiny_dir, out, "--clip", "fixed")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err
    assert out.read_bytes() == b"earlier artifact"
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "oscar.safetensors").write_bytes(b"earlier")
    assert main(_args(tiny_dir, tmp_path / "new.safetensors", "--out-dir",
                      str(tmp_path / "all"))) == 2
    assert "--out-dir" in capsys.readouterr().err
    (tmp_path / "all" / "oscar.safetensors").unlink()
    (tmp_path / "all").rmdir()
    assert main(_args(tiny_dir, out, "--clip", "fixed", "--force")) == 0
    assert RotationArtifact.load(out).method == "kv-cov"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "r.report.json", "r.report.md", "r.safetensors"]        # no temporary files left


def test_default_texts_are_disjoint_plays():
    cal, held = data.default_text_files(), data.default_heldout_files()
    assert all(os.path.isfile(f) for f in cal + held)
    assert not set(cal) & set(held)
    texts = data.read_texts(cal + held)
    assert all(len(t) > 50_000 for t in texts)


def test_split_and_chunks():
    ids = torch.arange(1000)
    a, b = data.split_heldout(ids, 0.1)
    assert a.numel() == 900 and b.numel() == 100 and int(b[0]) == 900
    chunks = list(data.iter_chunks(ids, 256, 700))
    assert [c.numel() for c in chunks] == [256, 256, 188]
    assert torch.equal(torch.cat(chunks), ids[:700])
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="heldout_fraction"):
        data.split_heldout(ids, 1.5)
    assert data.tokenize_files(tok, data.default_heldout_files()[:1])[0] == tok.bos_token_id


@pytest.mark.slow
def test_smollm2_calibration_small(tmp_path):
    """The embedded SmolLM2-135M: 1024 calibration tokens, one 1024-token held-out
    sequence; OSCAR must beat naive INT2 and the artifact must match the model."""
    out = tmp_path / "rot.safetensors"
    rc = main(["calibrate", "--tokens", "1024", "--eval-ctx", "1024", "--eval-sequences", "1",
               "--queries", "8", "--out", str(out), "--no-progress"])
    assert rc == 0
    art = RotationArtifact.load(out)
    fp = art.fingerprint
    assert (fp.num_layers, fp.num_qo_heads, fp.num_kv_heads, fp.head_dim) == (30, 9, 3, 64)
    rep = json.loads((tmp_path / "rot.report.json").read_text())["mean_error"]
    assert rep["oscar/head"]["search"] < rep["identity"]["none"]
    assert rep["oscar/head"]["search"] < rep["hadamard"]["none"]
    assert art.method == "kv-cov" and art.per_head
    # the shipped recipe: searched clips inside the default floors, and the rotation
    # beats Hadamard at the same clips on held-out attention error
    assert all(lr.k_clip >= 0.94 - 1e-9 and lr.v_clip >= 0.90 - 1e-9 for lr in art.layers)
    assert rep["kv-cov/head"]["search"] < rep["hadamard"]["search"]
