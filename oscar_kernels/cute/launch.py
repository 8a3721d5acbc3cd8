"""The CuTe decode launcher: checks, plan, buffers and the kernel launches.

:func:`decode` is the backend entry of :func:`oscar_kernels.ops.paged_decode_attention`
(inputs already validated there); :func:`decode_steps` exposes its launches one by one (the
per-step benchmark). The pointer and integer arguments follow the one ABI list in
:mod:`.config` (``DECODE_PTR_ARGS`` / ``DECODE_INT_ARGS``, ``MERGE_PTR_ARGS`` /
``MERGE_INT_ARGS``). Importing this module needs neither torch's CUDA nor cutlass.
"""

from __future__ import annotations

import math

from ..errors import BackendUnavailableError, UnsupportedConfigError, expect
from . import bundle
from .config import (ANY_PAGE_MAX_SLOTS, CHUNK, CTA_WARPS, DECODE_INT_ARGS, DECODE_PTR_ARGS,
                     FUSED_TAIL_ROWS, HEAD_DIMS, MAX_GROUP, MAX_SPLITS, MERGE_INT_ARGS,
                     MERGE_PTR_ARGS)
from .operands import mma_operand
from .plan import decode_op, launch_op, num_sms, num_splits_for, plan, wide_available
from .workspace import _counters


def _kind(dtype) -> int:
    """The kernels' element kind of a q/out dtype: 0 float32, 1 bf16, 2 fp16."""
    import torch

    return {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype]


def _check_cache_size(spec, num_pages: int) -> None:
    """The cache sizes the kernels index correctly (UnsupportedConfigError otherwise)."""
    rows = num_pages * spec.page_size * spec.num_kv_heads
    if rows >= 2 ** 31:
        raise UnsupportedConfigError(
            f"cache: the CuTe kernel indexes (page, slot, head) rows in int32; "
            f"num_pages * page_size * num_kv_heads = {rows}")
    slots = num_pages * spec.page_size
    if spec.page_size % CHUNK != 0 and slots > ANY_PAGE_MAX_SLOTS:
        raise UnsupportedConfigError(
            f"cache: with pages of {spec.page_size} tokens (not a multiple of {CHUNK}) the CuTe "
            f"kernel supports up to {ANY_PAGE_MAX_SLOTS} token slots (num_pages * page_size), "
            f"got {slots}")


def can_implement(op: str, *, device, spec, num_qo_heads: int, dtype,
                  num_pages: int | None = None) -> None:
    """Raise unless this backend can run ``op`` for this config on ``device`` (and, when
    given, a cache of ``num_pages`` pages)."""
    import torch

    if op != "decode":
        raise UnsupportedConfigError(f"the CuTe backend implements decode only, not {op!r}")
    if spec.head_dim not in HEAD_DIMS:
        raise UnsupportedConfigError(f"head_dim: CuTe kernels exist for {HEAD_DIMS}, got {spec.head_dim}")
    if spec.group_size != spec.head_dim:
        raise UnsupportedConfigError(
            f"group_size: the CuTe kernel needs one group per head (group_size == head_dim == "
            f"{spec.head_dim}), got {spec.group_size}")
    if spec.scale_dtype != torch.float16:
        raise UnsupportedConfigError(f"scale_dtype: the CuTe kernel needs torch.float16, got {spec.scale_dtype}")
    group = num_qo_heads // spec.num_kv_heads
    if not 1 <= group <= MAX_GROUP:
        raise UnsupportedConfigError(
            f"num_qo_heads: GQA ratio 1..{MAX_GROUP} supported, got {num_qo_heads}/"
            f"{spec.num_kv_heads} = {group}")
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise UnsupportedConfigError(f"dtype: bf16, fp16 or fp32 queries, got {dtype}")
    if num_pages is not None:
        _check_cache_size(spec, num_pages)
    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        raise BackendUnavailableError(f"the CuTe backend needs a CUDA sm_90 device, got {device}")
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        raise BackendUnavailableError(f"the CuTe backend needs sm_90 (H100/H200), got sm_{cap[0]}{cap[1]}")
    dims = bundle.available_head_dims()
    if spec.head_dim not in dims:
        raise BackendUnavailableError(f"head_dim: this build holds CuTe kernels for {dims} only, got {spec.head_dim}")
    any_page = spec.page_size % CHUNK != 0
    if any_page and not bundle.has_kernel(decode_op(group, any_page), spec.head_dim):
        raise UnsupportedConfigError(
            f"page_size: this CuTe build has kernels for multiples of {CHUNK} only (a bundle "
            f"before the any-page build), got {spec.page_size}")




def _row_strides(spec) -> tuple[int, int, int]:
    """(page, slot, head) strides in rows of ``head_dim / 4`` code bytes."""
    if spec.kv_layout == "NHD":
        return spec.page_size * spec.num_kv_heads, spec.num_kv_heads, 1
    return spec.num_kv_heads * spec.page_size, 1, spec.page_size


def decode(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v,
           sm_scale, *, out=None, num_splits: int | None = None, warps: int | None = None,
           merge_ctas: bool | None = None, ring4: bool | None = None,
           max_kv_len: int | None = None):
    """Backend entry of :func:`oscar_kernels.ops.paged_decode_attention` (inputs validated).

    ``q [batch_size, num_qo_heads, head_dim]``; returns ``(o, lse)``: ``o`` of q's dtype in
    the model's space (written into ``out`` when given), ``lse [batch_size, num_qo_heads]``
    float32 natural log. No host synchronization; every launch is graph-capturable.
    ``warps`` / ``num_splits`` override :func:`.plan.plan` (tests, benchmarks);
    ``merge_ctas`` forces the merge-CTA build (:func:`.plan.use_merge_ctas`) on or off for
    wide pair calls, ``ring4`` the 4-deep ring build (:func:`.plan.use_ring4`) for pair
    calls. ``max_kv_len``, the longest sequence's length in tokens, is a plan hint
    (:func:`.plan.short_splits`, :func:`.plan.use_ring4`): any value gives a correct result
    (another plan sums the splits in another order: float rounding, within the tests'
    tolerance), so a graph captured with one hint replays correctly at every length.
    """
    steps, result = decode_steps(q, cache, kv_indptr, kv_indices, kv_last_page_len,
                                 window_slots, rot_k, rot_v, sm_scale, out=out,
                                 num_splits=num_splits, warps=warps, merge_ctas=merge_ctas,
                                 ring4=ring4, max_kv_len=max_kv_len)
    for _, step in steps:
        step()
    return result()


def decode_steps(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v,
                 sm_scale, *, out=None, num_splits: int | None = None, warps: int | None = None,
                 merge_ctas: bool | None = None, ring4: bool | None = None,
                 max_kv_len: int | None = None):
    """The launches of :func:`decode` as ``[(name, fn)]`` over buffers allocated here, plus
    a ``result()`` returning ``(o, lse)`` after they ran (used by the per-step benchmark).
    ``merge_ctas`` forces the merge-CTA build on or off for wide pair calls, ``ring4`` the
    4-deep ring build for pair calls (tests), ``max_kv_len`` is the plan's length hint."""
    import torch

    spec = cache.spec
    batch_size, num_qo_heads, d = q.shape
    h = spec.num_kv_heads
    group = num_qo_heads // h
    dev = q.device
    _check_cache_size(spec, cache.num_pages)
    expect(warps is None or isinstance(warps, int) and warps in CTA_WARPS
           and (warps == 4 or d == 128), "warps",
           "None, 4 or (head_dim 128) 8", warps)
    expect(num_splits is None or isinstance(num_splits, int) and 1 <= num_splits <= MAX_SPLITS,
           "num_splits", f"an int in [1, {MAX_SPLITS}]", num_splits)
    expect(max_kv_len is None or isinstance(max_kv_len, int) and not isinstance(max_kv_len, bool),
           "max_kv_len", "None or an int", max_kv_len, TypeError)
    expect(max_kv_len is None or max_kv_len >= 0, "max_kv_len", "a length >= 0", max_kv_len)
    any_page = spec.page_size % CHUNK != 0
    if any_page and warps == 8:
        raise UnsupportedConfigError(
            f"warps: pages of {spec.page_size} tokens (not a multiple of {CHUNK}) run the "
            "any-page build, which has CTAs of 4 warps only; got 8")
    if warps is None or num_splits is None:
        sms = num_sms(dev)
        if warps is None:
            warps, planned = plan(batch_size, h, sms, group, d,
                                  wide_available(group, d, any_page), max_kv_len)
        else:
            planned = num_splits_for(batch_size, h, sms, group, warps, d)
            if warps == 8:      # the wide build merges in its fused tail only (below)
                planned = min(planned, max(1, FUSED_TAIL_ROWS // group))
        num_splits = planned if num_splits is None else num_splits
    op = launch_op(batch_size, h, group, d, warps, num_splits, dev, any_page, merge_ctas,
                   ring4, max_kv_len)
    use_merge = num_splits * group > FUSED_TAIL_ROWS
    o_part = torch.empty(batch_size, num_qo_heads, num_splits, d, dtype=torch.float32, device=dev)
    lse_part = torch.empty(batch_size, num_qo_heads, num_splits, dtype=torch.float32, device=dev)
    lse = torch.empty(batch_size, num_qo_heads, dtype=torch.float32, device=dev)
    # the kernel writes o in q's dtype straight into `out` when its last dim is contiguous
    o = out if out is not None and out.stride(-1) == 1 else torch.empty_like(q)
    if q.stride(-1) != 1:
        q = q.contiguous()

    # the rotations as fp16 tensor-core operands (cached per rotation tensor)
    rk_op, rk_stride = mma_operand(rot_k, transpose=True)
    rv_op, rv_op_stride = mma_operand(rot_v, transpose=False)
    tickets = _counters(dev, batch_size * h, trace="trace" in bundle.debug_flags())
    sp, ss, sh = _row_strides(spec)
    ptrs = {"q": q, "k_codes": cache.k_codes, "k_params": cache.k_params,
            "v_codes": cache.v_codes, "v_params": cache.v_params, "k_window": cache.k_window,
            "v_window": cache.v_window, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
            "kv_last_page_len": kv_last_page_len, "window_slots": window_slots,
            "o_part": o_part, "lse_part": lse_part, "rk_operand": rk_op, "rv_operand": rv_op,
            "o": o, "lse": lse, "tickets": tickets}
    ints = {"batch_size": batch_size, "num_kv_heads": h, "group": group,
            "page_size": spec.page_size, "stride_page": sp, "stride_slot": ss,
            "stride_head": sh, "sink": spec.sink_size, "recent": spec.recent_size,
            "num_splits": num_splits, "rk_stride": rk_stride, "rv_stride": rv_op_stride,
            "q_kind": _kind(q.dtype), "q_stride_b": q.stride(0), "q_stride_h": q.stride(1),
            "o_kind": _kind(o.dtype), "o_stride_b": o.stride(0), "o_stride_h": o.stride(1)}
    args = ([ptrs[n].data_ptr() for n in DECODE_PTR_ARGS]
            + [int(ints[n]) for n in DECODE_INT_ARGS])
    merge_ptrs = {"o_part": o_part, "lse_part": lse_part, "o": o, "lse": lse}
    merge_args = ([merge_ptrs[n].data_ptr() for n in MERGE_PTR_ARGS]
                  + [int(ints[n]) for n in MERGE_INT_ARGS])
    scale_log2 = float(sm_scale) * math.log2(math.e)
    # GQA ratio <= 4: the kernel specialized to run two chunks per softmax pass; pages that
    # are not a multiple of CHUNK tokens: the any-page build
    kernel = bundle.get_kernel(op, d, warps)

    def run_decode():
        # q @ R_K, attention over this CTA's split, then either (one split, or the merge
        # kernel next; 4-warp builds) o' @ R_V^T of its partial in the CTA (one split: the
        # store in q's dtype), or (fused tail) in the last CTA of each (sequence, KV head)
        # the split merge, o' @ R_V^T and the store in q's dtype
        with torch.cuda.device(dev):
            kernel(*args, scale_log2, torch.cuda.current_stream(dev).cuda_stream)

    def run_merge():
        with torch.cuda.device(dev):
            bundle.get_kernel("merge", d)(*merge_args,
                                          torch.cuda.current_stream(dev).cuda_stream)

    steps = [("decode", run_decode)]
    if use_merge:
        steps.append(("merge", run_merge))
    if out is not None and o is not out:
        steps.append(("copy_out", lambda: out.copy_(o)))

    def result():
        return (out if out is not None else o), lse
    return steps, result
