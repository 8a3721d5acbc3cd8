"""Readable Triton kernels: the GPU oracle. Not built yet."""

from __future__ import annotations

from ..errors import BackendUnavailableError


def can_implement(op: str, **_config) -> None:
    raise BackendUnavailableError("the Triton backend has no kernels in this build")
