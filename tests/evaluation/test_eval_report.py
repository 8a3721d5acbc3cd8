"""The evaluation report on hand-made rows (no model): the verdict opens results.md, the
shipped default is marked by rule, the figure survives outliers and small passkey counts,
and the committed example output is what the regeneration command writes."""

import json
import os

import pytest

from oscar_kernels.calibration.calibrate_cmd import DEFAULT_METHOD
from oscar_kernels.evaluation import report

pytest.importorskip("matplotlib")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "docs", "example-demo")
CTX, TAIL = 2048, 512


def _row(method, clip, kind, tail, kl, top1, k, n, bits=5.0):
    from oscar_kernels.evaluation.passkey import wilson_interval

    label = method if kind != "int2" else f"{method} ({clip} clip)"
    return {"method": method, "clip": clip, "label": label, "kind": kind,
            "bits_int2": 16.0 if kind == "bf16" else 2.5, f"bits@{CTX}": bits,
            f"ppl@{CTX}": tail * 0.9, f"tail_ppl@{CTX}": tail, "kl": kl, "top1": top1,
            "tokens": {f"tail_ppl@{CTX}": 3072}, "passkey": k / n, "passkey_correct": k,
            "passkey_n": n, "passkey_ci95": list(wilson_interval(k, n))}


def _rows(n=4):
    rows = [_row("bf16", "none", "bf16", 30.0, 0.0, 1.0, 3 * n // 4, n, bits=16.0),
            _row("naive", "fixed", "int2", 200.0, 1.9, 0.3, 0, n),       # the outlier
            _row("hadamard", "searched", "int2", 33.0, 0.12, 0.8, n // 2, n),
            _row("kivi", "none", "kivi", 36.0, 0.25, 0.7, n // 2, n, bits=3.4),
            _row(DEFAULT_METHOD, "fixed", "int2", 31.5, 0.05, 0.87, 3 * n // 4, n),
            _row(DEFAULT_METHOD, "searched", "int2", 31.0, 0.04, 0.88, n, n)]
    for r in rows:
        r[f"tail_ppl@{CTX}_vs_bf16_pct"] = 100.0 * (r[f"tail_ppl@{CTX}"] / 30.0 - 1.0)
    return rows


META = {"model_name": "tiny", "command": "oscar-kv eval", "windows": 2,
        "environment": {"cpu_count": 1, "threads": 1}, "seconds_total": 1.0}


def test_shipped_row_is_the_default_method_with_searched_clips():
    rows = _rows()
    assert report.shipped_default() == (DEFAULT_METHOD, "searched")
    assert [r["label"] for r in rows if report.is_shipped(r, rows)] == [
        f"{DEFAULT_METHOD} (searched clip)"]
    # the best baseline: lowest tail perplexity among the other INT2/KIVI rows
    assert report.best_baseline(rows, CTX)["label"] == f"{DEFAULT_METHOD} (fixed clip)"


def test_markdown_opens_with_the_verdict_and_marks_the_shipped_row():
    rows = _rows()
    text = report.report_markdown(rows, META, [1024, CTX], TAIL)
    title, blank, first = text.split("\n")[:3]
    assert title.startswith("# ") and blank == ""
    assert first.startswith("**Verdict:**")
    assert f"{DEFAULT_METHOD} (searched clip)" in first and "BF16" in first
    assert "raises tail perplexity @2048 by 3.3% over BF16" in first
    assert "4/4 vs BF16 3/4" in first and "too wide to say much" in first
    assert f"{DEFAULT_METHOD} (fixed clip)" in first      # the best baseline, named
    table = report.markdown_table(rows, [1024, CTX], TAIL)
    marked = [ln for ln in table.split("\n") if "(shipped)" in ln]
    assert len(marked) == 1 and marked[0].startswith(f"| **{DEFAULT_METHOD} (shipped)** | searched")


def test_verdict_with_enough_passkey_trials_gives_the_interval():
    rows = _rows(n=20)
    rows[-1]["passkey_vs_bf16"] = {"lost": 0, "won": 5, "p_mcnemar": 0.0625}
    first = report.verdict(rows, [CTX], META)
    assert "20/20 vs BF16 15/20" in first and "Wilson 95% [" in first
    assert "McNemar p=0.062" in first and "too wide" not in first


def test_verdict_without_a_shipped_row_says_so():
    every = _rows()
    rows = [r for r in every if not report.is_shipped(r, every)]
    first = report.verdict(rows, [CTX], META)
    assert first.startswith("**Verdict:**") and "not among these rows" in first
    assert "(shipped)" not in report.markdown_table(rows, [CTX], TAIL)


def test_axis_cap_cuts_above_the_first_large_jump_only():
    assert report.axis_cap([3.3, 3.6, 10.9, 12.9, 15.2, 18.2, 26.5, 202.6, 615.4]) == \
        pytest.approx(26.5 * 1.35)
    assert report.axis_cap([1.0, 2.0, 3.0, 4.0]) is None
    assert report.axis_cap([]) is None


@pytest.mark.parametrize("n", [4, 20])
def test_plot_writes_a_png_with_an_outlier_and_small_passkey_counts(tmp_path, n):
    path = tmp_path / "r.png"
    fig = report.plot(_rows(n), [1024, CTX], TAIL, str(path), title="tiny")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"kv-cov", "naive", "kivi", "searched clip", "fixed clip",
            "shipped default"} <= set(labels)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "+567%" in texts                      # the cut-off value is written out
    assert f"{n}/{n}" in texts                   # passkey as counts
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert any(t.startswith("★ shipped") for t in ticks)


def test_the_committed_example_is_what_the_regeneration_writes(tmp_path):
    assert report.main([os.path.join(EXAMPLE, "results.json"), str(tmp_path)]) == 0
    assert (tmp_path / "results.md").read_text() == \
        open(os.path.join(EXAMPLE, "results.md"), encoding="utf-8").read()
    assert (tmp_path / "results.png").stat().st_size > 10_000
    assert not (tmp_path / "results.json").exists()
    data = json.load(open(os.path.join(EXAMPLE, "results.json")))
    assert sum(report.is_shipped(r, data["rows"]) for r in data["rows"]) == 1


def test_verdict_and_figure_without_a_bf16_row(tmp_path):
    rows = [r for r in _rows() if r["kind"] != "bf16"]
    first = report.verdict(rows, [CTX], META)
    assert "no BF16 row was measured" in first and f"{DEFAULT_METHOD} (fixed clip)" in first
    report.plot(rows, [CTX], TAIL, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 1000
