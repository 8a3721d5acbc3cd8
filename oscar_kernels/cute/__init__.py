"""CuTe DSL Hopper kernels (the fast path). Not built yet: every op reports unsupported."""

from __future__ import annotations

from ..errors import BackendUnavailableError


def can_implement(op: str, **_config) -> None:
    raise BackendUnavailableError("the CuTe backend has no kernels in this build")
