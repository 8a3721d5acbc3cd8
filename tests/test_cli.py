"""``oscar-kv`` manners, on the CPU and without loading a model: help text, --version,
parse-time argument errors as one line with exit 2, runtime errors as one line with exit 1,
--debug tracebacks, Ctrl-C and SIGTERM exits, silenced progress bars and warnings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oscar_kernels import cli
from oscar_kernels.rotation import ModelFingerprint, RotationArtifact

COMMANDS = ("calibrate", "eval", "demo")


def _one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oscar-kv: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)
    return err


# ------------------------------------------------------------------ help and version
@pytest.mark.parametrize("argv", [[], *([c] for c in COMMANDS)])
def test_help_is_plain_text_with_examples(argv, capsys):
    assert cli.main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: oscar-kv")
    assert "``" not in out and "::" not in out and ":mod:" not in out and ":func:" not in out
    assert "examples:\n  oscar-kv " in out         # RawDescriptionHelpFormatter keeps layout


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"oscar-kv {cli.version()}"
    assert cli.version()[0].isdigit()


def test_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "oscar_kernels", "--version"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("oscar-kv ")


# ------------------------------------------------------------- parse-time errors
@pytest.mark.parametrize("argv, needle", [
    (["calibrate", "--tokens", "-5"], "--tokens"),
    (["calibrate", "--tokens", "many"], "--tokens"),
    (["calibrate", "--k-clip-min", "1.2"], "--k-clip-min"),
    (["calibrate", "--model", "/nonexistent"], "does not exist"),
    (["eval", "--model", "/nonexistent"], "does not exist"),
    (["eval", "--passkey-depths", "1.5"], "--passkey-depths"),
    (["eval", "--windows", "0"], "--windows"),
    (["demo", "--tokens", "100"], "--tokens"),
    (["calibrate", "--no-such-option"], "unrecognized arguments"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_usage_errors_are_one_line_exit_2(argv, needle, capsys):
    assert cli.main(argv) == 2
    _one_line_error(capsys, needle)


def test_text_files_are_checked_at_parse_time(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 100)
    for path, needle in ((empty, "is empty"), (binary, "binary"), (latin, "not UTF-8"),
                         (tmp_path / "missing.txt", "not a file")):
        for argv in (["calibrate", "--text", str(path)], ["eval", "--text", str(path)]):
            assert cli.main(argv) == 2
            _one_line_error(capsys, "--text", needle)


def test_output_paths_are_checked_at_parse_time(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert cli.main(["calibrate", "--out-dir", str(a_file)]) == 2
    _one_line_error(capsys, "--out-dir", "not a directory")
    assert cli.main(["calibrate", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "--out", "is a directory")
    assert cli.main(["eval", "--out-dir", str(a_file / "below")]) == 2
    _one_line_error(capsys, "--out-dir")


def _artifact(tmp_path, name="good.safetensors", fp=ModelFingerprint(2, 2, 4, 16)) -> str:
    path = tmp_path / name
    RotationArtifact.hadamard(fp).save(path)
    return str(path)


def test_unreadable_artifacts_are_usage_errors(tmp_path, capsys):
    noise = tmp_path / "noise.safetensors"
    noise.write_bytes(os.urandom(4096))
    good = _artifact(tmp_path)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(open(good, "rb").read()[:-100])
    for path in (noise, truncated):
        assert cli.main(["eval", "--rotations", str(path)]) == 2
        _one_line_error(capsys, str(path))
    assert cli.main(["eval", "--rotations", f"mine={tmp_path / 'absent.safetensors'}"]) == 2
    _one_line_error(capsys, "does not exist")
    folder = tmp_path / "folder"
    folder.mkdir()
    assert cli.main(["eval", "--rotations", str(folder)]) == 2       # no artifact in it
    _one_line_error(capsys, "--rotations", ".safetensors")
    (folder / "a.safetensors").write_bytes(open(good, "rb").read())
    (folder / "b.safetensors").write_bytes(b"not an artifact")
    assert cli.main(["eval", "--rotations", str(folder)]) == 2
    _one_line_error(capsys, "b.safetensors")


# ---------------------------------------------------------------- runtime errors
@pytest.fixture
def fake_run(monkeypatch):
    """Replace the calibrate command's ``run`` with the given function."""
    from oscar_kernels.calibration import calibrate_cmd

    def install(fn):
        monkeypatch.setattr(calibrate_cmd, "run", fn)
    return install


@pytest.mark.parametrize("exc, code", [
    (FileNotFoundError("model path: expected a local directory, got 'x'"), 1),
    (ValueError("--text: expected at least 600 tokens, got 12"), 1),
])
def test_runtime_errors_are_one_line_exit_1(exc, code, fake_run, tmp_path, capsys):
    def run(args):
        raise exc
    fake_run(run)
    assert cli.main(["calibrate", "--out", str(tmp_path / "r.safetensors")]) == code
    _one_line_error(capsys, str(exc).split(":")[0])


def test_artifact_error_is_one_line_and_debug_shows_the_traceback(fake_run, tmp_path, capsys):
    from oscar_kernels.errors import ArtifactError

    def run(args):
        raise ArtifactError("artifact made for another model:\n expected A, has B")
    fake_run(run)
    out = str(tmp_path / "r.safetensors")
    assert cli.main(["calibrate", "--out", out]) == 1
    _one_line_error(capsys, "another model: expected A, has B")
    assert cli.main(["calibrate", "--out", out, "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().endswith("expected A, has B")


def test_a_bug_is_one_line_that_points_at_debug(fake_run, tmp_path, capsys):
    def run(args):
        return {}["missing"]
    fake_run(run)
    assert cli.main(["calibrate", "--out", str(tmp_path / "r.safetensors")]) == 1
    _one_line_error(capsys, "internal error: KeyError", "--debug")


@pytest.mark.parametrize("exc, code, line", [
    (KeyboardInterrupt, 130, "interrupted"), (cli.Terminated, 143, "terminated")])
def test_interrupt_is_one_line(exc, code, line, fake_run, tmp_path, capsys):
    def run(args):
        raise exc()
    fake_run(run)
    assert cli.main(["calibrate", "--out", str(tmp_path / "r.safetensors")]) == code
    assert capsys.readouterr().err == f"{line}\n"


def test_sigterm_handler_is_installed_only_while_running(fake_run, tmp_path):
    import signal

    seen = []
    fake_run(lambda args: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["calibrate", "--out", str(tmp_path / "r.safetensors")]) == 0
    assert seen == [cli._on_sigterm] and signal.getsignal(signal.SIGTERM) is before


# ---------------------------------------------------------- progress and warnings
@pytest.mark.parametrize("argv, no_progress, quiet", [
    (["calibrate"], True, False),                       # stderr is not a terminal here
    (["--no-progress", "calibrate"], True, False),
    (["calibrate", "--quiet"], True, True),
    (["-q", "calibrate"], True, True),
])
def test_output_options_before_or_after_the_command(argv, no_progress, quiet, fake_run,
                                                    tmp_path):
    seen = []
    fake_run(lambda args: seen.append((args.no_progress, args.quiet, args.verbose)) or 0)
    assert cli.main([*argv, "--out", str(tmp_path / "r.safetensors")]) == 0
    assert seen == [(no_progress, quiet, False)]


@pytest.mark.parametrize("options, level", [
    ({}, "INFO"), ({"quiet": True}, "WARNING"), ({"verbose": True}, "DEBUG")])
def test_quiet_and_verbose_set_the_package_log_level(options, level):
    import logging

    logger = logging.getLogger("oscar_kernels")
    before = logger.level
    try:
        cli.configure_output(no_progress=False, **options)
        assert logging.getLevelName(logger.getEffectiveLevel()) == level
    finally:
        logger.setLevel(before)


_NOISY = r"""
import logging, warnings, sys
from tqdm import tqdm as early_tqdm                  # imported before the options apply
from oscar_kernels import cli
cli.configure_output(no_progress=%s)
from tqdm.auto import tqdm
for _ in tqdm(range(3), desc="bar"):
    pass
for _ in early_tqdm(range(3), desc="early"):
    pass
warnings.warn("a library warning")
import transformers
transformers.logging.get_logger("transformers.modeling_utils").warning("hf warning")
from huggingface_hub.utils import tqdm as hf_tqdm
for _ in hf_tqdm(range(3), desc="hub bar"):
    pass
from transformers.utils.logging import tqdm as tf_tqdm
for _ in tf_tqdm(range(3), desc="transformers bar"):
    pass
logging.getLogger("oscar_kernels.calibration").warning("our warning")
"""


@pytest.mark.parametrize("no_progress", [True, False])
def test_no_progress_silences_bars_and_library_warnings(no_progress):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TQDM_", "HF_HUB_DISABLE", "TRANSFORMERS_"))}
    r = subprocess.run([sys.executable, "-c", _NOISY % no_progress], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    noisy = ("bar", "early", "a library warning", "hf warning", "hub bar",
             "transformers bar")
    if no_progress:
        assert not any(n in r.stderr for n in noisy), r.stderr
    else:
        assert all(n in r.stderr for n in noisy), r.stderr
    assert "our warning" in r.stderr                     # the package's own warnings stay
