"""pyproject.toml's package data covers the files the package needs at run time: every file
of the prebuilt CuTe bundle (its manifest and each library the manifest lists) and the
calibration texts. A wheel built without them imports fine and fails only on a GPU or in
``oscar-kv calibrate``; .ci/wheel_check.py checks an installed wheel end to end."""

from __future__ import annotations

import glob
import json
import os

import pytest

tomllib = pytest.importorskip("tomllib")   # Python >= 3.11

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "oscar_kernels")


def _package_data() -> dict[str, list[str]]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-data"]


def _shipped(path: str) -> bool:
    """Whether a package-data glob of the nearest package above ``path`` matches it
    (setuptools expands each glob relative to its package's directory)."""
    data = _package_data()
    d = os.path.dirname(path)
    while os.path.commonpath([d, PKG]) == PKG:
        if os.path.isfile(os.path.join(d, "__init__.py")):
            name = os.path.relpath(d, ROOT).replace(os.sep, ".")
            hits = {os.path.normpath(p) for pat in data.get(name, []) + data.get("*", [])
                    for p in glob.glob(os.path.join(d, pat))}
            return os.path.normpath(path) in hits
        d = os.path.dirname(d)
    return False


def _bundles() -> list[str]:
    return glob.glob(os.path.join(PKG, "**", "prebuilt", "manifest.json"), recursive=True)


def test_there_is_a_prebuilt_bundle():
    assert _bundles(), "no prebuilt/manifest.json under oscar_kernels/"


@pytest.mark.parametrize("manifest", _bundles(), ids=lambda p: os.path.relpath(p, ROOT))
def test_package_data_covers_every_file_of_the_bundle(manifest):
    with open(manifest) as f:
        kernels = json.load(f)["kernels"]
    files = [manifest] + [os.path.join(os.path.dirname(manifest), k["library"])
                          for k in kernels.values()]
    for path in files:
        assert os.path.isfile(path), f"the manifest lists a missing file: {path}"
    missing = [os.path.relpath(p, ROOT) for p in files if not _shipped(p)]
    assert not missing, f"pyproject.toml package-data does not ship: {missing}"


def test_package_data_covers_the_calibration_texts():
    texts = glob.glob(os.path.join(PKG, "calibration", "texts", "*.txt"))
    assert texts
    assert all(_shipped(p) for p in texts)
