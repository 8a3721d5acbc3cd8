"""``oscar-kv demo`` writes outside tracked paths by default and never over another run:
its argument handling and output folder, run from a fresh git checkout, with the two
model steps replaced by stand-ins that write the files the real ones write."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from oscar_kernels import cli
from oscar_kernels.calibration import calibrate_cmd
from oscar_kernels.evaluation import demo_cmd, eval_cmd
from oscar_kernels.rotation import ModelFingerprint, RotationArtifact

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo, *argv) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c",
                           "user.email=t@example.com", *argv], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    repo = tmp_path / "checkout"
    (repo / "results" / "eval").mkdir(parents=True)
    (repo / "README.md").write_text("a project\n")
    (repo / "results" / "eval" / "results.md").write_text("committed numbers\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "initial")
    monkeypatch.chdir(repo)
    return repo


@pytest.fixture
def steps(monkeypatch):
    """Stand-ins for calibrate and eval: write their outputs, record their arguments."""
    calls = []

    def calibrate(args):
        calls.append(("calibrate", args))
        for path in calibrate_cmd.artifact_paths(args)[:3]:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            RotationArtifact.hadamard(ModelFingerprint(2, 2, 4, 16)).save(path)
        return 0

    def evaluate(args):
        calls.append(("eval", args))
        for name in ("results.md", "results.json", "results.png"):
            with open(os.path.join(args.out_dir, name), "w") as f:
                f.write("table")
        return 0
    monkeypatch.setattr(calibrate_cmd, "run", calibrate)
    monkeypatch.setattr(eval_cmd, "run", evaluate)
    return calls


def test_default_output_stays_out_of_git_status(checkout, steps, capsys):
    assert cli.main(["demo"]) == 0
    out = checkout / demo_cmd.DEFAULT_OUT_DIR
    assert {"rot.safetensors", "results.md", "rotations"} <= set(os.listdir(out))
    assert _git(checkout, "status", "--porcelain", "--untracked-files=all") == ""
    assert (checkout / "results" / "eval" / "results.md").read_text() == "committed numbers\n"
    (_, cal), (_, ev) = steps
    assert cal.out_dir == os.path.join(demo_cmd.DEFAULT_OUT_DIR, "rotations")
    assert ev.out_dir == demo_cmd.DEFAULT_OUT_DIR and not cal.force
    assert ev.windows == 2 and ev.passkey_keys == 1            # the quick default size
    capsys.readouterr()

    # a second run without --force refuses in one line, before any step runs
    assert cli.main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oscar-kv: error: --out-dir")
    assert "--force" in err and len(steps) == 2
    assert cli.main(["demo", "--force"]) == 0
    assert steps[-2][1].force and len(steps) == 4
    assert _git(checkout, "status", "--porcelain", "--untracked-files=all") == ""


def test_an_out_dir_that_holds_a_run_needs_force(tmp_path, checkout, steps, capsys):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "notes.txt").write_text("mine")
    assert cli.main(["demo", "--out-dir", str(earlier)]) == 2
    assert "holds another run" in capsys.readouterr().err and not steps
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["demo", "--out-dir", str(empty)]) == 0
    assert (empty / ".gitignore").read_text().splitlines()[-1] == "*"
