"""perf/tools/merge_parts.py: re-merging the committed SmolLM2 parts reproduces the
committed table and keeps the hand-written sections after the marker line."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "eval", "smollm2-135m")
PARTS = ["searched", "shipped", "fixed", "clip-variants", "clip-variants-2", "floors-k94v90"]


def _merge_parts():
    spec = importlib.util.spec_from_file_location(
        "merge_parts", os.path.join(ROOT, "perf", "tools", "merge_parts.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_remerge_reproduces_the_table_and_keeps_the_hand_written_tail(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    mp = _merge_parts()
    monkeypatch.chdir(ROOT)       # the table names the parts by the paths given
    committed = open(os.path.join(OUT, "results.md")).read()
    assert mp.KEEP_MARKER in committed
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(os.path.join(OUT, "results.md"), out / "results.md")
    assert mp.main([str(out)] + [f"results/eval/smollm2-135m/parts/{p}" for p in PARTS]) == 0
    assert (out / "results.md").read_text() == committed
    assert (out / "results.json").read_text() == open(os.path.join(OUT, "results.json")).read()
    # without an earlier results.md there is nothing to keep: the generated part only
    fresh = tmp_path / "fresh"
    assert mp.main([str(fresh)] + [f"results/eval/smollm2-135m/parts/{p}" for p in PARTS]) == 0
    text = (fresh / "results.md").read_text()
    assert mp.KEEP_MARKER not in text and committed.startswith(text.rstrip("\n"))
