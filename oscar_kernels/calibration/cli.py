"""``oscar-kv`` command line: ``calibrate``, ``eval``, ``demo``.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them up.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMANDS = {
    "calibrate": ("oscar_kernels.calibration.calibrate_cmd",
                  "fit OSCAR rotations (and baselines) from a real model"),
    "eval": ("oscar_kernels.calibration.eval_cmd",
             "measure perplexity, KL, top-1 agreement and passkey accuracy per method"),
    "demo": ("oscar_kernels.calibration.demo_cmd",
             "calibrate the embedded SmolLM2-135M on the default text, then evaluate"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oscar-kv", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # a subcommand whose module is missing still parses
            p.set_defaults(_missing=f"{name}: unavailable ({exc})")
            continue
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "_missing", None):
        print(args._missing, file=sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
