"""Argument types for the ``oscar-kv`` subcommands: each checks one command-line value at
parse time and raises ``argparse.ArgumentTypeError`` with a one-line reason.

Used as ``parser.add_argument("--tokens", type=int_at_least(1))``; argparse then reports
``argument --tokens: expected an int >= 1, got '-5'``. Only what a single value can tell
is checked here (types, ranges, paths); checks that need several arguments or the model
live in each subcommand.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

#: Bytes read to tell a text file from a binary one.
_SNIFF_BYTES = 1 << 16


def int_at_least(low: int) -> Callable[[str], int]:
    """An int ``>= low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}")
        return value
    parse.__name__ = f"int >= {low}"
    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """A float in ``[low, high]``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a number in [{low}, {high}], got {text!r}")
        return value
    parse.__name__ = f"number in [{low}, {high}]"
    return parse


def model_path(text: str) -> str:
    """An existing checkpoint directory or ``.gguf`` file."""
    if os.path.isdir(text):
        return text
    if os.path.isfile(text):
        if not text.lower().endswith(".gguf"):
            raise argparse.ArgumentTypeError(
                f"expected a Hugging Face checkpoint directory or a .gguf file, got {text!r}")
        return text
    raise argparse.ArgumentTypeError(f"{text!r} does not exist (expected a Hugging Face "
                                     "checkpoint directory or a .gguf file)")


def text_file(text: str) -> str:
    """An existing, non-empty, plain UTF-8 text file."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    with open(text, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if not head.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty (expected plain UTF-8 text)")
    if b"\0" in head:
        raise argparse.ArgumentTypeError(f"{text!r} is a binary file (expected plain UTF-8 text)")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a multi-byte character cut by the sniff
            raise argparse.ArgumentTypeError(
                f"{text!r} is not UTF-8 text (invalid byte at offset {exc.start})") from None
    return text


def existing_path(text: str) -> str:
    """A file or directory that exists."""
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    return text


def _creatable_dir(path: str) -> None:
    """Raise unless ``path`` is a writable directory or can be created as one."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise argparse.ArgumentTypeError(f"{path!r}: {probe!r} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{path!r}: {probe!r} is not writable")


def output_dir(text: str) -> str:
    """A directory that exists or can be created (not a file)."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    _creatable_dir(text)
    return text


def output_file(text: str) -> str:
    """A file path whose directory exists or can be created (not a directory)."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory (expected a file path)")
    _creatable_dir(os.path.dirname(os.path.abspath(text)))
    return text
