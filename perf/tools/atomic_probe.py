"""What same-address atomics cost when many warps claim work from one counter at once.

A chunk pool (a measured alternative of the CuTe decode that was not kept;
docs/cute-design.md) had every warp of a (sequence, KV head) claim pool pairs with
``atom.add`` on one counter near the end of its range: at qwen3-8b batch 1 that is 128 warps on each of 8 counters within ~2 us. This times the
bare pattern with the harness of perf/bench_decode.py (CUDA-graph replay, cold L2,
median): ``N`` one-warp programs, each a chain of relaxed atomic adds (each one's address
depends on the previous result, so they are round trips one after another, not
fire-and-forget reductions), on ``K`` counters (program ``p`` uses counter ``p % K``,
counters 128 B apart). ``K == N`` is the uncontended case; the difference to it
is what the sharing costs the whole launch.

    PYTHONPATH=. python perf/tools/atomic_probe.py --out perf/results/<date>_h200_atomic_probe_<c>.txt
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness import env_header, time_cuda  # noqa: E402


@triton.jit
def _claim(counters, out, K: tl.constexpr, ROUNDS: tl.constexpr):
    pid = tl.program_id(0)
    slot = counters + (pid % K) * 32        # 128-byte lines apart
    acc = 0
    step = 0
    for _ in tl.static_range(ROUNDS):
        # relaxed, like the kernel's claims; each claim's address depends on the previous
        # result (never negative, so always the same counter): a chain of round trips
        v = tl.atomic_add(slot + step, 1, sem="relaxed")
        step = tl.where(v < 0, 1, 0)
        acc += v
    tl.store(out + pid, acc)


def probe(n: int, k: int, rounds: int, dev) -> float:
    counters = torch.zeros(k * 32, dtype=torch.int32, device=dev)
    out = torch.empty(n, dtype=torch.int32, device=dev)

    def run():
        _claim[(n,)](counters, out, K=k, ROUNDS=rounds, num_warps=1)
    return time_cuda(run)["median_ms"] * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, nargs="+", default=[32, 128, 1024])
    ap.add_argument("--rounds", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    cmd = "PYTHONPATH=. python perf/tools/atomic_probe.py " + " ".join(argv or sys.argv[1:])
    lines = [f"# {env_header(cmd)}",
             "# programs (one warp each), counters, dependent claims per program: launch us "
             "(graph replay, cold L2, median); extra = over the same launch with one counter "
             "per program"]
    for n in a.programs:
        for r in a.rounds:
            base = probe(n, n, r, dev)
            for k in sorted({1, 8, n}):
                if k > n:
                    continue
                t = probe(n, k, r, dev)
                lines.append(f"programs {n:5d} counters {k:5d} claims {r}: {t:7.2f} us "
                             f"(extra {t - base:+6.2f} us)")
                print(lines[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
