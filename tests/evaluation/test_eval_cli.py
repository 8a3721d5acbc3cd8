"""``oscar-kv eval`` end to end on a tiny random Llama saved to disk: a run writes its
three files; an artifact made for another model is a one-line error, exit 1."""

from __future__ import annotations

import json

import pytest

from evalhelpers import save_checkpoint
from oscar_kernels import cli
from oscar_kernels.rotation import ModelFingerprint, RotationArtifact

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = save_checkpoint(tmp_path_factory.mktemp("tiny_llama"), seed=3)
    (d / "held.txt").write_text("the quick brown fox jumps over the lazy dog. " * 12)
    return d


def _eval(d, out, *extra):
    return ["eval", "--model", str(d), "--text", str(d / "held.txt"), "--ctx", "128",
            "--contexts", "64", "--windows", "2", "--tail-start", "32", "--sink-size", "4",
            "--recent-size", "8", "--passkey-lengths", "400", "--passkey-depths", "0.5",
            "--passkey-keys", "1", "--out-dir", str(out), *extra]


def test_eval_cli_writes_the_table(tiny_dir, tmp_path, capsys):
    art = RotationArtifact.hadamard(ModelFingerprint(2, 2, 4, 16))
    art.save(tmp_path / "had.safetensors")
    assert cli.main(_eval(tiny_dir, tmp_path / "out", "--rotations",
                          f"mine={tmp_path / 'had.safetensors'}", "--methods", "bf16",
                          "mine", "kivi", "--clip", "fixed")) == 0
    printed = capsys.readouterr().out
    assert "| mine | fixed |" in printed
    rows = json.load(open(tmp_path / "out" / "results.json"))["rows"]
    assert [r["label"] for r in rows] == ["bf16", "mine (fixed clip)", "kivi"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "results.json", "results.md", "results.png"]


@pytest.mark.parametrize("fp", [ModelFingerprint(3, 2, 4, 16),     # other layer count
                                ModelFingerprint(2, 2, 4, 32)])    # other head_dim
def test_artifact_for_another_model_is_one_line_exit_1(tiny_dir, tmp_path, capsys, fp):
    RotationArtifact.hadamard(fp).save(tmp_path / "other.safetensors")
    assert cli.main(_eval(tiny_dir, tmp_path / "out", "--rotations",
                          str(tmp_path / "other.safetensors"))) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oscar-kv: error: ")
    assert "another model" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
