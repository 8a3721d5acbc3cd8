"""The reference as a backend of :mod:`oscar_kernels.ops` (any device, any config)."""

from __future__ import annotations

from .paged import append_paged_kv, paged_decode, paged_extend


def can_implement(op: str, **_config) -> None:
    """The reference implements every op and configuration."""


def append(cache, *args) -> None:
    append_paged_kv(cache, *args)


def decode(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v,
           sm_scale, *, out=None, max_kv_len=None):
    """The spec (``max_kv_len``, a plan hint for fast backends, is not needed here)."""
    return paged_decode(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots,
                        rot_k, rot_v, sm_scale)


def extend(q, append_key, append_value, qo_indptr, cache, kv_indptr, kv_indices,
           kv_last_page_len, window_slots, rot_k, rot_v, k_clip, v_clip, sm_scale, *, out=None):
    return paged_extend(q, append_key, append_value, qo_indptr, cache, kv_indptr, kv_indices,
                        kv_last_page_len, window_slots, rot_k, rot_v, k_clip, v_clip, sm_scale)
