"""Readable Triton kernels: the GPU oracle and the fallback of ``backend="auto"``.

Three ops, each the executable spec of :mod:`oscar_kernels.reference.paged` on the GPU
(or on the CPU under ``TRITON_INTERPRET=1``):

* :func:`~.quantize_append.quantize_append_paged_kv_cache_triton` — one fused kernel: rotate,
  clip, quantize, pack, store codes/params and the BF16 window rows.
* :func:`~.paged_decode.paged_decode_attention_triton` — split-KV decode with a log-sum-exp
  merge (the merge also un-rotates the output).
* :func:`~.paged_extend.paged_extend_attention_triton` — chunked prefill over the cached prefix.

This module is the backend protocol of :mod:`oscar_kernels.ops`: :func:`can_implement`,
:func:`append`, :func:`decode`, :func:`extend`. Importing it needs ``triton``; the
kernels are compiled on first use.
"""

from __future__ import annotations

import os

import torch

from ..errors import BackendUnavailableError, UnsupportedConfigError

try:
    import triton  # noqa: F401
    _TRITON_ERROR: str | None = None
except ImportError as exc:  # the package stays importable; can_implement reports it
    _TRITON_ERROR = str(exc)

OPS = ("append", "decode", "extend")
MAX_GQA = 16


def can_implement(op: str, *, device: torch.device, spec, num_qo_heads: int,
                  dtype: torch.dtype, num_pages: int | None = None) -> None:
    """Raise unless the Triton backend runs ``op`` for this configuration here.

    Raises
    ------
    BackendUnavailableError
        ``triton`` is not importable, or the device is neither CUDA nor the CPU under
        ``TRITON_INTERPRET=1``.
    UnsupportedConfigError
        A valid configuration these kernels do not implement: attention needs
        ``head_dim`` in {64, 128, 256} (``tl.dot`` takes ``head_dim / 4 >= 16``),
        ``group_size`` in {D, D/2, D/4} (at most one group per channel quarter) and a GQA
        ratio of at most 16; append needs ``head_dim <= 256``.
    """
    if _TRITON_ERROR is not None:
        raise BackendUnavailableError(f"triton is not importable: {_TRITON_ERROR}")
    device = torch.device(device)
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise BackendUnavailableError("the Triton backend runs on the CPU only under "
                                          "TRITON_INTERPRET=1 (set before triton is imported)")
    elif device.type != "cuda":
        raise BackendUnavailableError(f"the Triton backend needs a CUDA device, got {device}")
    if op not in OPS:
        raise UnsupportedConfigError(f"op: expected one of {OPS}, got {op!r}")
    d = spec.head_dim
    if d > 256:
        raise UnsupportedConfigError(f"head_dim: expected <= 256 for the Triton kernels, got {d}")
    if op == "append":
        return
    if d < 64:
        raise UnsupportedConfigError(
            f"head_dim: expected 64, 128 or 256 for Triton attention (head_dim/4 >= 16 for "
            f"tl.dot), got {d}")
    if spec.num_groups not in (1, 2, 4):
        raise UnsupportedConfigError(
            f"group_size: expected one of {d}, {d // 2}, {d // 4} (head_dim, /2, /4) for "
            f"Triton attention, got {spec.group_size}")
    gqa = num_qo_heads // spec.num_kv_heads
    if gqa > MAX_GQA:
        raise UnsupportedConfigError(
            f"num_qo_heads: expected at most {MAX_GQA} query heads per KV head for Triton "
            f"attention, got {gqa}")


def append(cache, append_key, append_value, batch_indices, positions, kv_indices, kv_indptr,
           kv_last_page_len, window_slots, rot_k, rot_v, k_clip, v_clip) -> None:
    from .quantize_append import quantize_append_paged_kv_cache_triton

    quantize_append_paged_kv_cache_triton(cache, append_key, append_value, batch_indices,
                                          positions, kv_indices, kv_indptr, kv_last_page_len,
                                          window_slots, rot_k, rot_v, k_clip, v_clip)


def decode(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v,
           sm_scale, *, out=None, max_kv_len=None):
    """The Triton decode (``max_kv_len``, the CuTe plan's length hint, is not used)."""
    from .paged_decode import paged_decode_attention_triton

    return paged_decode_attention_triton(q, cache, kv_indptr, kv_indices, kv_last_page_len,
                                         window_slots, rot_k, rot_v, sm_scale, out=out)


def extend(q, append_key, append_value, qo_indptr, cache, kv_indptr, kv_indices,
           kv_last_page_len, window_slots, rot_k, rot_v, k_clip, v_clip, sm_scale, *, out=None,
           plan=None):
    from .paged_extend import paged_extend_attention_triton

    return paged_extend_attention_triton(q, append_key, append_value, qo_indptr, cache,
                                         kv_indptr, kv_indices, kv_last_page_len, window_slots,
                                         rot_k, rot_v, k_clip, v_clip, sm_scale, out=out,
                                         plan=plan)


__all__ = ["can_implement", "append", "decode", "extend"]
