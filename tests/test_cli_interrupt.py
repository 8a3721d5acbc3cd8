"""Files are written atomically: an interrupted ``oscar-kv calibrate`` (SIGINT or SIGTERM,
on the embedded SmolLM2-135M) exits 130 / 143 with one line, leaves no partial or
temporary file and keeps the artifact already at ``--out`` byte for byte."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from oscar_kernels.rotation import ModelFingerprint, RotationArtifact, atomic_output


# ------------------------------------------------------------------ atomic_output
def test_atomic_output_replaces_the_file_in_one_step(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    with atomic_output(path) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path) and tmp != str(path)
        with open(tmp, "w") as f:
            f.write("new")
        assert path.read_text() == "old"               # not visible before the block ends
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["a.txt"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
def test_atomic_output_interrupted_mid_write_keeps_the_old_file(tmp_path, exc):
    path = tmp_path / "rot.safetensors"
    path.write_bytes(b"old artifact")
    with pytest.raises(exc):
        with atomic_output(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half a new art")
            raise exc()
    assert path.read_bytes() == b"old artifact"
    assert os.listdir(tmp_path) == ["rot.safetensors"]


def test_artifact_save_is_atomic(tmp_path, monkeypatch):
    """A save that fails inside safetensors leaves the existing artifact and no temp file."""
    import safetensors.torch

    fp = ModelFingerprint(2, 2, 4, 16)
    path = tmp_path / "rot.safetensors"
    RotationArtifact.identity(fp).save(path)
    before = path.read_bytes()

    def broken(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(KeyboardInterrupt):
        RotationArtifact.hadamard(fp).save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["rot.safetensors"]
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------ a real interrupted calibrate
def _embedded_model() -> str:
    pytest.importorskip("transformers")
    from oscar_kernels.calibration.data import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("sig, code, line, after", [
    (signal.SIGINT, 130, "interrupted", "loading model"),        # during the model load
    (signal.SIGTERM, 143, "terminated", "loading model"),
    # during the statistics pass: the model load comes first (about 1.5 min on 2 busy cores)
    pytest.param(signal.SIGINT, 130, "interrupted", "calibration tokens",
                 marks=pytest.mark.slow),
])
def test_interrupted_calibrate_keeps_the_existing_artifact(tmp_path, sig, code, line, after):
    _embedded_model()
    out = tmp_path / "rot.safetensors"
    RotationArtifact.hadamard(ModelFingerprint(30, 3, 9, 64)).save(out)
    before = out.read_bytes()
    cmd = [sys.executable, "-m", "oscar_kernels", "calibrate", "--tokens", "1024",
           "--eval-ctx", "1024", "--eval-sequences", "1", "--queries", "8", "--threads", "1",
           "--out", str(out), "--out-dir", str(tmp_path / "all"), "--force", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    try:
        seen = []
        for text in proc.stderr:
            seen.append(text)
            if after in text:
                break
        assert proc.poll() is None, "".join(seen)
        proc.send_signal(sig)
        _, rest = proc.communicate(timeout=120)
    finally:
        watchdog.cancel()
    err = "".join(seen) + rest
    assert proc.returncode == code, err
    assert rest.strip().splitlines()[-1] == line and "Traceback" not in err
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["rot.safetensors"]     # no temp, no partial
