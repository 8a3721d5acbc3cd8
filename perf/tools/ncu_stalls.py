"""Warp-stall samples of one kernel from Nsight Compute's per-SASS source page.

    ncu --clock-control none -k regex:'(?i)int2' --launch-skip 1 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters -o rep python3 perf/tools/ncu_decode_probe.py ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep_sass.csv
    python3 perf/tools/ncu_stalls.py rep_sass.csv [more.csv ...] [--top 25] [--hot 0.5]

Prints, per file, the samples by stall reason over the whole kernel and over its hot
instructions (executed at least ``--hot`` times the most executed one's count: the main loop),
then the ``--top`` hot instructions by samples with their main reasons. Reads only the CSV.
"""

import argparse
import csv

REASONS = ["selected", "not_selected", "long_sb", "short_sb", "wait", "math", "mio", "lg",
           "barrier", "branch_resolving", "dispatch", "no_inst", "membar", "drain", "misc",
           "imc", "sleep", "tex"]


def _num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    cols = rows[head]
    out = []
    for r in rows[head + 1:]:
        if len(r) < len(cols):
            continue
        d = dict(zip(cols, r))
        out.append({
            "addr": d["Address"], "sass": d["Source"].strip(),
            "samples": _num(d["Warp Stall Sampling (All Samples)"]),
            "executed": _num(d["Instructions Executed"]),
            **{k: _num(d.get("stall_" + k, "0")) for k in REASONS},
        })
    return out


def summarize(rows, label):
    tot = sum(r["samples"] for r in rows) or 1.0
    parts = sorted(((sum(r[k] for r in rows), k) for k in REASONS), reverse=True)
    body = ", ".join(f"{k} {v / tot * 100:.1f}%" for v, k in parts if v / tot >= 0.005)
    print(f"  {label}: {len(rows)} instr, {tot:.0f} samples, "
          f"{sum(r['executed'] for r in rows):.0f} warp-instr executed; {body}")
    return tot


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--hot", type=float, default=0.5)
    a = ap.parse_args()
    for path in a.csv:
        rows = load(path)
        print(f"== {path}")
        summarize(rows, "kernel")
        peak = max(r["executed"] for r in rows)
        hot = [r for r in rows if r["executed"] >= a.hot * peak]
        tot = summarize(hot, f"hot (executed >= {a.hot:g} x {peak:.0f})")
        print(f"  top {a.top} hot instructions by samples (share of the hot samples; main reasons):")
        for r in sorted(hot, key=lambda r: -r["samples"])[:a.top]:
            why = sorted(((r[k], k) for k in REASONS), reverse=True)[:3]
            why = ", ".join(f"{k} {v:.0f}" for v, k in why if v)
            print(f"    {r['addr'][-5:]} {r['samples'] / tot * 100:5.1f}%  {r['sass'][:60]:60s} {why}")


if __name__ == "__main__":
    main()
