"""Typed errors raised by oscar-kernels.

Wrong dtype raises ``TypeError`` and a wrong shape or value raises ``ValueError``
(the built-ins, so callers can catch them without importing this module); the
classes here cover what the built-ins cannot say.
"""

from __future__ import annotations


class OscarError(Exception):
    """Base class of every error specific to oscar-kernels."""


class UnsupportedConfigError(OscarError, NotImplementedError):
    """A valid configuration that the chosen backend does not implement.

    ``backend="auto"`` catches it and falls back to the next backend (logged once).
    """


class ArtifactError(OscarError, ValueError):
    """A rotation artifact that is malformed, inconsistent, or made for another model."""


class BackendUnavailableError(OscarError, RuntimeError):
    """The requested backend cannot run here (package missing, no GPU, wrong arch)."""


def _describe(value: object) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"tensor of shape {tuple(shape)} and dtype {dtype}"
    return repr(value)


def expect(cond: bool, name: str, expected: str, received: object, exc: type = ValueError) -> None:
    """Raise ``exc`` naming the argument, the expected and the received value unless ``cond``."""
    if not cond:
        raise exc(f"{name}: expected {expected}, got {_describe(received)}")
