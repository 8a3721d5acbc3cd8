"""Per-window tail perplexity of bf16 and the shipped artifact over whole held-out plays.

``oscar-kv eval`` reports one aggregate per row. This script calls the same functions
(``evaluate.run_perplexity`` on one window at a time, ``eval_windows`` on each play's own
token stream) so the window-to-window spread of the INT2 penalty can be read off. Every
window has the same number of tail tokens, so the log of a row's aggregate tail perplexity
is the mean of the per-window logs: the first 6 windows of a play reproduce the CLI's
6-window table for that play (checked in the output).

Usage (from the repository root; about 17 s per window and method on 2 CPU threads)::

    PYTHONPATH=. python perf/tools/per_window.py \
        --rotations results/eval/demo/rotations/kv-cov.safetensors \
        --text results/eval/smollm2-135m/heldout2/texts/julius_caesar_gut.txt \
               results/eval/smollm2-135m/heldout2/texts/twelfth_night_gut.txt \
               oscar_kernels/calibration/texts/macbeth_gut.txt \
        --max-windows 12 --out results/eval/smollm2-135m/heldout2/per_window.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

from oscar_kernels.calibration.data import default_model_path, load_model, tokenize_files
from oscar_kernels.evaluation.methods import build_methods, load_rotations
from oscar_kernels.evaluation.metrics import eval_windows, run_perplexity
from oscar_kernels.evaluation.report import environment
from oscar_kernels.integrations.transformers import model_fingerprint

CTX = 2048
TAIL_START = 512


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rotations", required=True, help="the shipped artifact")
    p.add_argument("--text", nargs="+", required=True, help="plays, each windowed on its own")
    p.add_argument("--max-windows", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_model(default_model_path())
    fp = model_fingerprint(model.config)
    rotations = load_rotations([f"shipped={args.rotations}"], fp)
    rows, notes = build_methods(fp, rotations, ["bf16", "shipped"], ["searched"])
    assert not notes, notes
    out = {"command": "PYTHONPATH=. python " + " ".join(
               os.path.relpath(a) if os.path.exists(a) else a for a in sys.argv),
           "ctx": CTX, "tail_start": TAIL_START, "environment": environment(), "plays": {}}
    for path in args.text:
        ids = tokenize_files(tok, [path])
        windows = eval_windows(ids, CTX, args.max_windows)
        per = []
        for i, w in enumerate(windows):
            r = run_perplexity(model, rows, [w], contexts=[1024, CTX], tail_start=TAIL_START,
                               progress=False)
            b, s = r["bf16"], r["shipped (searched clip)"]
            per.append({"window": i, "bf16_tail_ppl": b[f"tail_ppl@{CTX}"],
                        "shipped_tail_ppl": s[f"tail_ppl@{CTX}"], "shipped_kl": s["kl"],
                        "shipped_top1": s["top1"],
                        "log_ratio": math.log(s[f"tail_ppl@{CTX}"] / b[f"tail_ppl@{CTX}"])})
            print(f"{os.path.basename(path)} window {i}: bf16 {per[-1]['bf16_tail_ppl']:.2f} "
                  f"shipped {per[-1]['shipped_tail_ppl']:.2f} "
                  f"({100 * math.expm1(per[-1]['log_ratio']):+.1f}%)", flush=True)
        out["plays"][os.path.basename(path)] = {"tokens": int(ids.numel()), "windows": per,
                                                "summary": summarize(per)}
        with open(args.out, "w") as f:      # after every play: a partial run keeps its plays
            json.dump(out, f, indent=1)
    allw = [w for v in out["plays"].values() for w in v["windows"]]
    out["all"] = summarize(allw)
    out["seconds_total"] = round(time.perf_counter() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for name, v in out["plays"].items():
        print(name, json.dumps(v["summary"]))
    print("all", json.dumps(out["all"]))


def summarize(per: list[dict]) -> dict:
    """Aggregate tail ppl (geometric mean over equal-size windows) and the spread of the
    per-window log ratio shipped / bf16 (mean, sample sd, standard error)."""
    def agg(rows, key):
        return math.exp(statistics.fmean(math.log(r[key]) for r in rows))

    lr = [r["log_ratio"] for r in per]
    sd = statistics.stdev(lr) if len(lr) > 1 else float("nan")
    first6 = per[:6]
    return {"windows": len(per),
            "bf16_tail_ppl": agg(per, "bf16_tail_ppl"),
            "shipped_tail_ppl": agg(per, "shipped_tail_ppl"),
            "delta_pct": 100 * math.expm1(statistics.fmean(lr)),
            "log_ratio_sd": sd, "log_ratio_se": sd / math.sqrt(len(lr)),
            "delta_pct_min": 100 * math.expm1(min(lr)), "delta_pct_max": 100 * math.expm1(max(lr)),
            "windows_over_3pct": sum(x > math.log(1.03) for x in lr),
            "first6_bf16_tail_ppl": agg(first6, "bf16_tail_ppl"),
            "first6_shipped_tail_ppl": agg(first6, "shipped_tail_ppl"),
            "first6_delta_pct": 100 * math.expm1(statistics.fmean(r["log_ratio"] for r in first6)),
            "mean_kl": statistics.fmean(r["shipped_kl"] for r in per)}


if __name__ == "__main__":
    main()
