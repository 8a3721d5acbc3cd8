"""oscar-kernels: INT2 KV caches with offline spectral rotations (OSCAR).

Importing this package needs only torch; backends (triton, cutlass) load on first use.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "CacheSpec": "oscar_kernels.spec",
    "FORMAT_VERSION": "oscar_kernels.spec",
    "Int2PagedKVCache": "oscar_kernels.cache",
    "LayerRotation": "oscar_kernels.rotation",
    "ModelFingerprint": "oscar_kernels.rotation",
    "RotationArtifact": "oscar_kernels.rotation",
    "UnsupportedConfigError": "oscar_kernels.errors",
    "ArtifactError": "oscar_kernels.errors",
    "BackendUnavailableError": "oscar_kernels.errors",
    "quantize_append_paged_kv_cache": "oscar_kernels.ops",
    "paged_decode_attention": "oscar_kernels.ops",
    "paged_extend_attention": "oscar_kernels.ops",
    "get_batch_indices_positions": "oscar_kernels.ops",
}
_SUBMODULES = {"ops", "spec", "errors", "cache", "rotation", "reference"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"oscar_kernels.{name}")
    raise AttributeError(f"module 'oscar_kernels' has no attribute {name!r}")
