"""Thin adapters over :mod:`oscar_kernels.ops`: FlashInfer-shaped plan/run wrappers, the
SGLang plugin (the ``oscar_kernels.integrations.sglang`` package, loaded by SGLang's
``sglang.srt.plugins`` entry point), the transformers cache and tensor-parallel head
sharding.

Names load lazily so importing this package needs only torch (docs/integrations.md).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Int2BatchDecodeWithPagedKVCacheWrapper": "oscar_kernels.integrations.flashinfer",
    "Int2BatchPrefillWithPagedKVCacheWrapper": "oscar_kernels.integrations.flashinfer",
    "append_paged_kv_cache": "oscar_kernels.integrations.flashinfer",
    "get_batch_indices_positions": "oscar_kernels.page",
    "get_seq_lens": "oscar_kernels.page",
}
_SUBMODULES = {"flashinfer", "sglang", "transformers", "tp"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"oscar_kernels.integrations.{name}")
    raise AttributeError(f"module 'oscar_kernels.integrations' has no attribute {name!r}")
