"""``oscar-kv demo``: calibrate the embedded SmolLM2-135M on the default text, then evaluate.

Two steps, each with progress bars:

1. ``oscar-kv calibrate --clip search --out-dir <out>/rotations`` on ``--tokens``
   calibration tokens (*Hamlet*, *Othello*, *King Lear*): one pass of statistics gives
   every artifact (identity, hadamard, kv-cov, oscar, ...) with per-layer searched clips;
2. ``oscar-kv eval`` on held-out text (*Macbeth*, *The Tempest*): ``bf16``, ``naive``,
   ``hadamard``, ``kivi``, ``oscar`` and ``kv-cov`` (calibrate's shipped recipe: per-head
   KᵀK / VᵀV eigenbases, also written to ``<out>/rot.safetensors``), the INT2 ones under
   the fixed and the searched clip policy; prints the table and writes
   ``results.md/.json/.png`` to ``--out-dir``.

Defaults are sized for a 2-core CPU (see docs/evaluation.md for the measured time); raise
``--tokens``, ``--windows`` and the passkey grid for tighter numbers.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

log = logging.getLogger(__name__)

DEFAULT_OUT = os.path.join("results", "eval", "demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="checkpoint directory or .gguf (default: embedded SmolLM2-135M)")
    parser.add_argument("--text", nargs="+", default=None, metavar="FILE",
                        help="calibration text (default: Hamlet, Othello, King Lear)")
    parser.add_argument("--tokens", type=int, default=12288,
                        help="calibration tokens (default 12288)")
    parser.add_argument("--methods", nargs="+",
                        default=["bf16", "naive", "hadamard", "kivi", "oscar", "kv-cov"],
                        help="rows (default: bf16 naive hadamard kivi oscar kv-cov; 'kv-cov' "
                             "is calibrate's shipped recipe; 'auto' is also calibrated)")
    parser.add_argument("--windows", type=int, default=2,
                        help="held-out windows of 2048 tokens (default 2)")
    parser.add_argument("--passkey-lengths", type=int, nargs="+", default=[1024, 1536],
                        help="passkey prompt lengths (default 1024 1536)")
    parser.add_argument("--passkey-depths", type=float, nargs="+", default=[0.25, 0.75],
                        help="needle depths (default 0.25 0.75)")
    parser.add_argument("--passkey-keys", type=int, default=1, metavar="N",
                        help="keys per (length, depth) (default 1: 4 trials per row, sized "
                             "for the demo's time budget; the committed results use 60)")
    parser.add_argument("--no-passkey", action="store_true")
    parser.add_argument("--out-dir", default=DEFAULT_OUT,
                        help=f"results and rotations go here (default {DEFAULT_OUT})")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _eval_args(args, rot_dir: str) -> argparse.Namespace:
    from . import eval_cmd

    p = argparse.ArgumentParser()
    eval_cmd.add_arguments(p)
    argv = ["--rotations", rot_dir, "--methods", *args.methods, "--windows",
            str(args.windows), "--passkey-lengths", *map(str, args.passkey_lengths),
            "--passkey-depths", *map(str, args.passkey_depths), "--passkey-keys",
            str(args.passkey_keys), "--out-dir", args.out_dir]
    if args.model:
        argv += ["--model", args.model]
    if args.no_passkey:
        argv.append("--no-passkey")
    if args.no_progress:
        argv.append("--no-progress")
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return p.parse_args(argv)


def run(args) -> int:
    import torch

    from ..errors import expect
    from . import cli, eval_cmd

    expect(args.tokens >= 1024, "--tokens", "an int >= 1024", args.tokens)
    expect(args.windows >= 1, "--windows", "a positive int", args.windows)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rot_dir = os.path.join(args.out_dir, "rotations")
    os.makedirs(rot_dir, exist_ok=True)
    cal = ["calibrate", "--tokens", str(args.tokens), "--clip", "search",
           "--out", os.path.join(args.out_dir, "rot.safetensors"), "--out-dir", rot_dir,
           "--eval-sequences", "1"]
    if args.model:
        cal += ["--model", args.model]
    if args.text:
        cal += ["--text", *args.text]
    if args.no_progress:
        cal.append("--no-progress")
    if args.threads:
        cal += ["--threads", str(args.threads)]
    print(f"[1/2] oscar-kv {' '.join(cal)}", flush=True)
    rc = cli.main(cal)
    if rc:
        return rc
    t_cal = time.perf_counter() - t0
    print(f"[2/2] oscar-kv eval (calibration took {t_cal:.0f} s)", flush=True)
    rc = eval_cmd.run(_eval_args(args, rot_dir))
    total = time.perf_counter() - t0
    print(f"demo: {total:.0f} s (calibration {t_cal:.0f} s, evaluation {total - t_cal:.0f} s)")
    return rc
