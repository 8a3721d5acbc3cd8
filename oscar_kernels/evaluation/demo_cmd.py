"""``oscar-kv demo``: calibrate the embedded SmolLM2-135M on the default text, then evaluate.

Two steps, each with progress bars:

1. ``oscar-kv calibrate --clip search --out-dir <out>/rotations`` on ``--tokens``
   calibration tokens (*Hamlet*, *Othello*, *King Lear*): one pass of statistics gives
   every artifact (identity, hadamard, kv-cov, oscar, auto) with per-layer searched clips;
2. ``oscar-kv eval`` on held-out text (*Macbeth*, *The Tempest*): ``bf16``, ``naive``,
   ``hadamard``, ``kivi``, ``oscar`` and ``kv-cov`` (calibrate's shipped recipe, also
   written to ``<out>/rot.safetensors``), the INT2 ones under the fixed and the searched
   clip policy; prints the table and writes ``results.md/.json/.png``.

Everything goes to one output folder (default ``./oscar-kv-demo``), which holds a
``.gitignore`` that ignores the folder itself, so a run inside a git checkout leaves
``git status`` clean. A folder that holds another run is only reused with ``--force``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from ..calibration import arguments as types
from ..calibration import calibrate_cmd
from . import eval_cmd

log = logging.getLogger(__name__)

DEFAULT_OUT_DIR = "oscar-kv-demo"
DEFAULT_METHODS = ("bf16", "naive", "hadamard", "kivi", "oscar", "kv-cov")
#: Evaluation size of a plain ``demo`` (about 6 minutes on an idle 2-core CPU,
#: docs/evaluation.md) and of ``demo --full`` (the size of the committed SmolLM2 table:
#: 6 windows, 60 passkey prompts per row).
SIZES = {
    "quick": {"windows": 2, "passkey_lengths": [1024, 1536], "passkey_depths": [0.25, 0.75],
              "passkey_keys": 1},
    "full": {"windows": 6, "passkey_lengths": [768, 1024, 1280, 1536],
             "passkey_depths": [0.1, 0.3, 0.5, 0.7, 0.9], "passkey_keys": 3},
}
_IGNORE_ALL = "# written by oscar-kv demo: ignore this whole folder\n*\n"

SUMMARY = "calibrate the embedded SmolLM2-135M on the default text, then evaluate"
DESCRIPTION = """\
Calibrate the embedded SmolLM2-135M on Hamlet, Othello and King Lear (every rotation
method, per-layer searched clips), then evaluate bf16, naive INT2, Hadamard, KIVI-2,
OSCAR and kv-cov on held-out Macbeth and The Tempest: perplexity, KL, top-1 and passkey.

examples:
  oscar-kv demo
      about 6 minutes on an idle 2-core CPU; writes ./oscar-kv-demo/
  oscar-kv demo --out-dir my-demo --force
      reuse a folder that holds an earlier run
  oscar-kv demo --full
      the evaluation size of the published table (6 windows, 60 passkey prompts per
      row; tens of minutes on 2 cores)

outputs (in --out-dir): rot.safetensors and its report, rotations/ with one artifact per
method, results.md, results.json and results.png.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    quick, full = SIZES["quick"], SIZES["full"]
    parser.add_argument("--model", type=types.model_path, default=None, metavar="PATH",
                        help="checkpoint directory or .gguf (default: embedded SmolLM2-135M)")
    parser.add_argument("--text", type=types.text_file, nargs="+", default=None,
                        metavar="FILE",
                        help="calibration text (default: Hamlet, Othello, King Lear)")
    parser.add_argument("--tokens", type=types.int_at_least(1024), default=12288, metavar="N",
                        help="calibration tokens (default 12288)")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), metavar="NAME",
                        help=f"rows (default: {' '.join(DEFAULT_METHODS)}; kv-cov is "
                             "calibrate's shipped recipe; auto is also calibrated)")
    parser.add_argument("--full", action="store_true",
                        help=f"evaluate at the size of the published table: "
                             f"{full['windows']} windows, passkey "
                             f"{len(full['passkey_lengths'])} lengths x "
                             f"{len(full['passkey_depths'])} depths x "
                             f"{full['passkey_keys']} keys (slow)")
    parser.add_argument("--windows", type=types.int_at_least(1), default=None, metavar="N",
                        help=f"held-out windows of 2048 tokens (default {quick['windows']}, "
                             f"--full {full['windows']})")
    parser.add_argument("--passkey-lengths", type=types.int_at_least(128), nargs="+",
                        default=None, metavar="N",
                        help="passkey prompt lengths (default "
                             f"{' '.join(map(str, quick['passkey_lengths']))})")
    parser.add_argument("--passkey-depths", type=types.float_in(0.0, 1.0), nargs="+",
                        default=None, metavar="D",
                        help="needle depths (default "
                             f"{' '.join(map(str, quick['passkey_depths']))})")
    parser.add_argument("--passkey-keys", type=types.int_at_least(1), default=None,
                        metavar="N",
                        help=f"keys per (length, depth) (default {quick['passkey_keys']}: 4 "
                             "prompts per row)")
    parser.add_argument("--no-passkey", action="store_true", help="skip passkey retrieval")
    parser.add_argument("--out-dir", type=types.output_dir, default=DEFAULT_OUT_DIR,
                        metavar="DIR",
                        help=f"results and rotations go here (default ./{DEFAULT_OUT_DIR})")
    parser.add_argument("--force", action="store_true",
                        help="write into an --out-dir that holds another run")
    parser.add_argument("--threads", type=types.int_at_least(1), default=None, metavar="N",
                        help="torch CPU threads (default: torch's choice)")


def holds_a_run(path: str) -> bool:
    """Whether ``path`` is a folder with anything in it but the demo's ``.gitignore``."""
    return os.path.isdir(path) and any(n != ".gitignore" for n in os.listdir(path))


def check_args(args) -> None:
    """Fill the evaluation size (``--full`` or the quick default, explicit flags win) and
    refuse an ``--out-dir`` that holds another run unless ``--force``."""
    size = SIZES["full" if args.full else "quick"]
    for name, value in size.items():
        if getattr(args, name) is None:
            setattr(args, name, list(value) if isinstance(value, list) else value)
    if holds_a_run(args.out_dir) and not args.force:
        raise FileExistsError(f"--out-dir: {args.out_dir} holds another run; pass --force "
                              "to write into it, or choose another --out-dir")


def prepare_out_dir(path: str) -> str:
    """Create ``path`` with a ``.gitignore`` that ignores the folder itself; return it."""
    os.makedirs(path, exist_ok=True)
    marker = os.path.join(path, ".gitignore")
    if not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as f:
            f.write(_IGNORE_ALL)
    return path


def _sub_args(name: str, module, argv: list[str], args) -> argparse.Namespace:
    """Parse ``argv`` with ``module``'s arguments; carry over the output options."""
    parser = argparse.ArgumentParser(prog=f"oscar-kv {name}")
    module.add_arguments(parser)
    sub = parser.parse_args(argv)
    sub.no_progress = getattr(args, "no_progress", False)
    return sub


def _common(args) -> list[str]:
    argv = ["--model", args.model] if args.model else []
    return argv + (["--threads", str(args.threads)] if args.threads else [])


def calibrate_argv(args, rot_dir: str) -> list[str]:
    """The ``oscar-kv calibrate`` arguments of step 1."""
    argv = ["--tokens", str(args.tokens), "--clip", "search",
            "--out", os.path.join(args.out_dir, "rot.safetensors"), "--out-dir", rot_dir,
            "--eval-sequences", "1", *_common(args)]
    if args.text:
        argv += ["--text", *args.text]
    return argv + (["--force"] if args.force else [])


def eval_argv(args, rot_dir: str) -> list[str]:
    """The ``oscar-kv eval`` arguments of step 2."""
    argv = ["--rotations", rot_dir, "--methods", *args.methods, "--windows",
            str(args.windows), "--passkey-lengths", *map(str, args.passkey_lengths),
            "--passkey-depths", *map(str, args.passkey_depths), "--passkey-keys",
            str(args.passkey_keys), "--out-dir", args.out_dir, *_common(args)]
    return argv + (["--no-passkey"] if args.no_passkey else [])


def run(args) -> int:
    t0 = time.perf_counter()
    prepare_out_dir(args.out_dir)
    rot_dir = os.path.join(args.out_dir, "rotations")
    cal = calibrate_argv(args, rot_dir)
    cal_args = _sub_args("calibrate", calibrate_cmd, cal, args)
    calibrate_cmd.check_args(cal_args)
    print(f"[1/2] oscar-kv calibrate {' '.join(cal)}", flush=True)
    rc = calibrate_cmd.run(cal_args)
    if rc:
        return rc
    t_cal = time.perf_counter() - t0
    ev = eval_argv(args, rot_dir)
    eval_args = _sub_args("eval", eval_cmd, ev, args)
    eval_cmd.check_args(eval_args)
    print(f"[2/2] oscar-kv eval {' '.join(ev)} (calibration took {t_cal:.0f} s)", flush=True)
    rc = eval_cmd.run(eval_args)
    total = time.perf_counter() - t0
    print(f"demo: {total:.0f} s (calibration {t_cal:.0f} s, evaluation {total - t_cal:.0f} s); "
          f"results in {args.out_dir}")
    return rc
