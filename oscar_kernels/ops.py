"""Public ops: validate, normalize, dispatch by backend.

Three ops, in FlashInfer's vocabulary, each with ``backend=`` one of ``"reference"``
(pure torch, the spec), ``"triton"`` (readable GPU kernels; also on CPU under
``TRITON_INTERPRET=1``), ``"cute"`` (CuTe DSL, Hopper) or ``"auto"`` (CuTe on sm_90,
else Triton on CUDA, else the reference; each fallback is logged once).

Only these functions validate their inputs; backends assume valid input. Shape and
dtype checks never synchronize with the device; index bounds are checked when
``check_bounds=True`` (the default), which reads the page table on the host: pass
``check_bounds=False`` inside CUDA-graph capture after checking once at plan time.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
from types import ModuleType

import torch

from .cache import Int2PagedKVCache
from .errors import BackendUnavailableError, UnsupportedConfigError, expect
from .page import get_batch_indices_positions  # noqa: F401  (re-exported)
from .rotation import LayerRotation
from .spec import seq_lens_from_page_table

log = logging.getLogger(__name__)

BACKENDS = ("reference", "triton", "cute")
_BACKEND_MODULES = {
    "reference": "oscar_kernels.reference.backend",
    "triton": "oscar_kernels.triton",
    "cute": "oscar_kernels.cute",
}
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_logged_fallbacks: set[tuple[str, str, str]] = set()


# ----------------------------------------------------------------- dispatch
def _load_backend(name: str) -> ModuleType:
    try:
        return importlib.import_module(_BACKEND_MODULES[name])
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {name!r} cannot be imported: {exc}") from exc


def _candidates(backend: str, device: torch.device) -> list[str]:
    expect(backend in BACKENDS + ("auto",), "backend", f"one of {BACKENDS + ('auto',)}", backend)
    if backend != "auto":
        return [backend]
    if device.type == "cuda":
        return ["cute", "triton", "reference"]
    return ["reference"]


def _on_device(fn, device: torch.device):
    """``fn`` running with ``device`` as the current CUDA device: Triton launches on the
    current device and rejects pointers of another one ("cannot be accessed from Triton"),
    so a cache on cuda:1 must work while cuda:0 is current (found on a 2-GPU H200 run)."""
    if device.type != "cuda":
        return fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.cuda.device(device):
            return fn(*args, **kwargs)
    return run


def _dispatch(op: str, backend: str, device: torch.device, config: dict):
    """Return ``(name, function)`` of the first backend that implements ``op``."""
    names = _candidates(backend, device)
    last_exc: Exception | None = None
    for name in names:
        try:
            mod = _load_backend(name)
            mod.can_implement(op, device=device, **config)
            return name, _on_device(getattr(mod, op), device)
        except (UnsupportedConfigError, BackendUnavailableError) as exc:
            if backend != "auto":
                raise
            key = (op, name, type(exc).__name__ + str(exc))
            if key not in _logged_fallbacks:
                _logged_fallbacks.add(key)
                log.warning("oscar_kernels: %s backend %r unavailable (%s); falling back",
                            op, name, exc)
            last_exc = exc
    raise BackendUnavailableError(f"no backend implements {op}: {last_exc}")


# --------------------------------------------------------------- validation
def _check_int_tensor(t, name: str, ndim: int, device: torch.device) -> None:
    expect(isinstance(t, torch.Tensor), name, "a torch.Tensor", t, TypeError)
    expect(t.dtype == torch.int32, name, "dtype torch.int32", t, TypeError)
    expect(t.dim() == ndim, name, f"a {ndim}-D tensor", t)
    expect(t.device == device, name, f"device {device} (the cache's)", t.device)


def _check_float_tensor(t, name: str, shape: tuple, device: torch.device) -> None:
    expect(isinstance(t, torch.Tensor), name, "a torch.Tensor", t, TypeError)
    expect(t.dtype in _FLOAT_DTYPES, name, "dtype bfloat16, float16 or float32", t, TypeError)
    expect(tuple(t.shape) == tuple(shape), name, f"shape {tuple(shape)}", t)
    expect(t.device == device, name, f"device {device} (the cache's)", t.device)


def _check_cache_and_table(cache, kv_indptr, kv_indices, kv_last_page_len, window_slots,
                           rotation, check_bounds: bool) -> tuple[int, torch.Tensor | None]:
    expect(isinstance(cache, Int2PagedKVCache), "cache", "an Int2PagedKVCache", cache, TypeError)
    cache.validate()
    spec, dev = cache.spec, cache.device
    _check_int_tensor(kv_indptr, "kv_indptr", 1, dev)
    expect(kv_indptr.shape[0] >= 2, "kv_indptr", "shape [batch_size + 1] with batch_size >= 1",
           kv_indptr)
    batch_size = kv_indptr.shape[0] - 1
    _check_int_tensor(kv_indices, "kv_indices", 1, dev)
    _check_int_tensor(kv_last_page_len, "kv_last_page_len", 1, dev)
    expect(kv_last_page_len.shape[0] == batch_size, "kv_last_page_len",
           f"shape [{batch_size}] (batch_size)", kv_last_page_len)
    _check_int_tensor(window_slots, "window_slots", 1, dev)
    expect(window_slots.shape[0] == batch_size, "window_slots", f"shape [{batch_size}]",
           window_slots)
    expect(isinstance(rotation, LayerRotation), "rotation", "a LayerRotation", rotation, TypeError)
    for name in ("rot_k", "rot_v"):
        r = getattr(rotation, name)
        expect(r.dtype == torch.float32, f"rotation.{name}", "dtype float32", r, TypeError)
        expect(r.dim() == 3 and r.shape[1:] == (spec.head_dim, spec.head_dim)
               and r.shape[0] in (1, spec.num_kv_heads), f"rotation.{name}",
               f"shape [1 or {spec.num_kv_heads}, {spec.head_dim}, {spec.head_dim}]", r)
        expect(r.device == dev, f"rotation.{name}", f"device {dev} (the cache's)", r.device)
    if not check_bounds:
        return batch_size, None
    indptr = kv_indptr.cpu().long()
    expect(int(indptr[0]) == 0, "kv_indptr[0]", "0", int(indptr[0]))
    diffs = indptr[1:] - indptr[:-1]
    expect(bool((diffs >= 0).all()), "kv_indptr", "non-decreasing offsets (no negative "
           "page counts)", indptr.tolist())
    expect(int(indptr[-1]) <= kv_indices.shape[0], "kv_indptr[-1]",
           f"<= len(kv_indices) = {kv_indices.shape[0]}", int(indptr[-1]))
    used = kv_indices[: int(indptr[-1])].cpu()
    if used.numel():
        lo, hi = int(used.min()), int(used.max())
        expect(lo >= 0 and hi < cache.num_pages, "kv_indices",
               f"page ids in [0, {cache.num_pages})", f"values in [{lo}, {hi}]")
    last = kv_last_page_len.cpu().long()
    has_pages = diffs > 0
    ok = torch.where(has_pages, (last >= 1) & (last <= spec.page_size), last == 0)
    expect(bool(ok.all()), "kv_last_page_len",
           f"values in [1, {spec.page_size}] (0 for a sequence without pages)", last.tolist())
    slots = window_slots.cpu().long()
    expect(bool(((slots >= 0) & (slots < cache.num_window_slots)).all()), "window_slots",
           f"values in [0, {cache.num_window_slots})", slots.tolist())
    expect(slots.unique().numel() == slots.numel(), "window_slots", "distinct slots per sequence",
           slots.tolist())
    return batch_size, seq_lens_from_page_table(indptr, last, spec.page_size)


def _config(cache, num_qo_heads: int, dtype: torch.dtype) -> dict:
    return {"spec": cache.spec, "num_qo_heads": num_qo_heads, "dtype": dtype,
            "num_pages": cache.num_pages}


def _finish(o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype,
            return_lse: bool):
    if out is None:
        out = o if o.dtype == dtype else o.to(dtype)
    elif o.data_ptr() != out.data_ptr():
        out.copy_(o)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------- ops
def quantize_append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor,
                                   batch_indices: torch.Tensor, positions: torch.Tensor,
                                   cache: Int2PagedKVCache, kv_indices: torch.Tensor,
                                   kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                                   window_slots: torch.Tensor, rotation: LayerRotation, *,
                                   backend: str = "auto", check_bounds: bool = True) -> None:
    """Rotate, clip, quantize, pack and store new K/V tokens into the paged cache (in place).

    Parameters
    ----------
    append_key, append_value : Tensor ``[nnz, num_kv_heads, head_dim]``
        New tokens in the model's (unrotated) space; bf16, fp16 or fp32.
    batch_indices, positions : Tensor ``[nnz]`` int32
        Sequence and position of each new token (FlashInfer's
        ``get_batch_indices_positions``).
    cache : Int2PagedKVCache
        Written in place: INT2 codes/params of every token, BF16 sink rows for positions
        ``< sink_size`` and BF16 recent-ring rows for positions ``>= seq_len - recent_size``.
    kv_indices, kv_indptr, kv_last_page_len : Tensor int32
        FlashInfer page table ``[num_used_pages]``, ``[batch_size + 1]``, ``[batch_size]``,
        already covering the new tokens (lengths after the append).
    window_slots : Tensor ``[batch_size]`` int32
        Window-store slot of each sequence.
    rotation : LayerRotation
        ``R_K``/``R_V`` ``[1 or num_kv_heads, head_dim, head_dim]`` and clip ratios.

    Example
    -------
    >>> import torch
    >>> from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation, ops
    >>> spec = CacheSpec(num_kv_heads=2, head_dim=64, page_size=16)
    >>> cache = Int2PagedKVCache.allocate(spec, num_pages=4, num_window_slots=1)
    >>> k, v = torch.randn(2, 20, 2, 64, dtype=torch.bfloat16)
    >>> i32 = lambda *x: torch.tensor(x, dtype=torch.int32)
    >>> ops.quantize_append_paged_kv_cache(k, v, torch.zeros(20, dtype=torch.int32),
    ...     torch.arange(20, dtype=torch.int32), cache, i32(3, 1), i32(0, 2), i32(4), i32(0),
    ...     LayerRotation.hadamard(64))
    """
    spec = cache.spec if isinstance(cache, Int2PagedKVCache) else None
    expect(spec is not None, "cache", "an Int2PagedKVCache", cache, TypeError)
    expect(isinstance(append_key, torch.Tensor) and append_key.dim() == 3, "append_key",
           "a tensor [nnz, num_kv_heads, head_dim]", append_key)
    nnz = append_key.shape[0]
    shape = (nnz, spec.num_kv_heads, spec.head_dim)
    _check_float_tensor(append_key, "append_key", shape, cache.device)
    _check_float_tensor(append_value, "append_value", shape, cache.device)
    expect(append_value.dtype == append_key.dtype, "append_value", f"dtype {append_key.dtype}",
           append_value, TypeError)
    for name, t in (("batch_indices", batch_indices), ("positions", positions)):
        _check_int_tensor(t, name, 1, cache.device)
        expect(t.shape[0] == nnz, name, f"shape [{nnz}] (nnz)", t)
    batch_size, seq_lens = _check_cache_and_table(cache, kv_indptr, kv_indices, kv_last_page_len,
                                                  window_slots, rotation, check_bounds)
    if check_bounds and nnz:
        b = batch_indices.cpu().long()
        p = positions.cpu().long()
        expect(bool(((b >= 0) & (b < batch_size)).all()), "batch_indices",
               f"values in [0, {batch_size})", b.tolist()[:16])
        expect(bool((p >= 0).all()), "positions", "non-negative values", p.tolist()[:16])
        expect(bool((p < seq_lens[b]).all()), "positions",
               "values < the sequence length given by the page table", p.tolist()[:16])
        keys = b * (int(p.max()) + 1) + p
        expect(keys.unique().numel() == nnz, "positions", "distinct (batch, position) pairs",
               "duplicates")
    if nnz == 0:
        return
    rot_k, rot_v = rotation.per_head(spec.num_kv_heads)
    _, fn = _dispatch("append", backend, cache.device,
                      _config(cache, spec.num_kv_heads, append_key.dtype))
    fn(cache, append_key, append_value, batch_indices, positions, kv_indices, kv_indptr,
       kv_last_page_len, window_slots, rot_k, rot_v, float(rotation.k_clip),
       float(rotation.v_clip))


def paged_decode_attention(q: torch.Tensor, cache: Int2PagedKVCache, kv_indptr: torch.Tensor,
                           kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                           window_slots: torch.Tensor, rotation: LayerRotation, *,
                           sm_scale: float | None = None, out: torch.Tensor | None = None,
                           return_lse: bool = False, backend: str = "auto",
                           check_bounds: bool = True, max_kv_len: int | None = None):
    """Decode attention of one query per sequence over the mixed INT2/BF16 paged cache.

    Parameters
    ----------
    q : Tensor ``[batch_size, num_qo_heads, head_dim]``
        Queries in the model's space (bf16, fp16 or fp32); ``num_qo_heads`` is a multiple
        of ``num_kv_heads`` (GQA). Each query sits at position ``seq_len - 1``: positions
        ``< sink_size`` and ``>= seq_len - recent_size`` are read in BF16, the rest INT2.
    cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rotation
        As in :func:`quantize_append_paged_kv_cache`.
    sm_scale : float, optional
        Softmax scale, default ``1 / sqrt(head_dim)``.
    out : Tensor, optional
        ``[batch_size, num_qo_heads, head_dim]`` of ``q.dtype``, written in place.
    return_lse : bool
        Also return the natural-log log-sum-exp ``[batch_size, num_qo_heads]`` float32
        (``-inf`` for an empty sequence, whose output is 0).
    max_kv_len : int, optional
        The longest sequence of the batch in tokens, when the caller knows it on the host
        (e.g. from its own length list): a hint for length-dependent plan choices of the CuTe
        backend (fewer splits, a shallower copy ring, and where the shapes alone would
        run 4-warp CTAs the wide ones, for short sequences; see
        :func:`oscar_kernels.cute.plan`). Any value gives a correct result (another
        plan only sums the splits in another order), so a CUDA graph captured with one hint
        replays correctly at every length. ``None``: plans from the shapes alone.

    Returns
    -------
    Tensor ``[batch_size, num_qo_heads, head_dim]`` of ``q.dtype`` in the model's space
    (``o @ R_V^T`` applied once), and the lse when asked.
    """
    expect(isinstance(cache, Int2PagedKVCache), "cache", "an Int2PagedKVCache", cache, TypeError)
    spec = cache.spec
    expect(isinstance(q, torch.Tensor) and q.dim() == 3, "q",
           "a tensor [batch_size, num_qo_heads, head_dim]", q)
    batch_size, _ = _check_cache_and_table(cache, kv_indptr, kv_indices, kv_last_page_len,
                                           window_slots, rotation, check_bounds)
    num_qo_heads = q.shape[1]
    expect(num_qo_heads % spec.num_kv_heads == 0, "q", f"num_qo_heads a multiple of "
           f"num_kv_heads={spec.num_kv_heads}", q)
    _check_float_tensor(q, "q", (batch_size, num_qo_heads, spec.head_dim), cache.device)
    if out is not None:
        _check_float_tensor(out, "out", tuple(q.shape), cache.device)
        expect(out.dtype == q.dtype, "out", f"dtype {q.dtype}", out, TypeError)
    expect(max_kv_len is None or isinstance(max_kv_len, int) and not isinstance(max_kv_len, bool),
           "max_kv_len", "None or an int", max_kv_len, TypeError)
    expect(max_kv_len is None or max_kv_len >= 0, "max_kv_len", "a length >= 0", max_kv_len)
    scale = 1.0 / math.sqrt(spec.head_dim) if sm_scale is None else float(sm_scale)
    rot_k, rot_v = rotation.per_head(spec.num_kv_heads)
    _, fn = _dispatch("decode", backend, cache.device, _config(cache, num_qo_heads, q.dtype))
    o, lse = fn(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v,
                scale, out=out, max_kv_len=max_kv_len)
    return _finish(o, lse, out, q.dtype, return_lse)


def plan_extend(qo_indptr: torch.Tensor, cache: Int2PagedKVCache, kv_indptr: torch.Tensor,
                kv_last_page_len: torch.Tensor, window_slots: torch.Tensor):
    """Plan an extend batch once for every layer of a forward pass (FlashInfer's plan/run
    split): reads the page table on the host once and copies the index tensors the Triton
    extend needs to the device. Pass the result as ``plan=`` to
    :func:`paged_extend_attention` for each layer of the same batch (the same chunks, page
    table and window slots, caches of the same spec)."""
    expect(isinstance(cache, Int2PagedKVCache), "cache", "an Int2PagedKVCache", cache, TypeError)
    _check_int_tensor(qo_indptr, "qo_indptr", 1, cache.device)
    from .triton.paged_extend import plan_extend as _plan
    return _plan(qo_indptr, kv_indptr, kv_last_page_len, window_slots, cache.spec)


def paged_extend_attention(q: torch.Tensor, append_key: torch.Tensor,
                           append_value: torch.Tensor, qo_indptr: torch.Tensor,
                           cache: Int2PagedKVCache, kv_indptr: torch.Tensor,
                           kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                           window_slots: torch.Tensor, rotation: LayerRotation, *,
                           sm_scale: float | None = None, out: torch.Tensor | None = None,
                           return_lse: bool = False, backend: str = "auto",
                           check_bounds: bool = True, plan=None):
    """Append a chunk of new tokens per sequence and attend with the chunk's queries.

    The prefix-cache-hit and chunked-prefill case: sequence ``b`` gets
    ``qo_indptr[b+1] - qo_indptr[b]`` new tokens at the end (the page table already
    covers them). Each query at position ``t`` attends causally, reading position ``p``
    in BF16 when ``p < sink_size`` or ``p > t - recent_size`` and INT2 otherwise, so a
    chunked prefill gives the same result as token-by-token decode. The cache is updated
    in place exactly as :func:`quantize_append_paged_kv_cache` would.

    Parameters
    ----------
    q : Tensor ``[nnz, num_qo_heads, head_dim]``
    append_key, append_value : Tensor ``[nnz, num_kv_heads, head_dim]``
    qo_indptr : Tensor ``[batch_size + 1]`` int32, ``qo_indptr[-1] == nnz``
    plan : optional
        :func:`plan_extend` of this batch: made once per forward pass and passed to every
        layer, it saves each call the host read of the page table (the Triton backend; the
        reference ignores it).
    others : as in :func:`paged_decode_attention`.

    Returns
    -------
    Tensor ``[nnz, num_qo_heads, head_dim]`` of ``q.dtype`` (and lse ``[nnz, num_qo_heads]``).
    """
    expect(isinstance(cache, Int2PagedKVCache), "cache", "an Int2PagedKVCache", cache, TypeError)
    spec = cache.spec
    expect(isinstance(q, torch.Tensor) and q.dim() == 3, "q",
           "a tensor [nnz, num_qo_heads, head_dim]", q)
    nnz, num_qo_heads = q.shape[0], q.shape[1]
    expect(num_qo_heads % spec.num_kv_heads == 0, "q", f"num_qo_heads a multiple of "
           f"num_kv_heads={spec.num_kv_heads}", q)
    _check_float_tensor(q, "q", (nnz, num_qo_heads, spec.head_dim), cache.device)
    kv_shape = (nnz, spec.num_kv_heads, spec.head_dim)
    _check_float_tensor(append_key, "append_key", kv_shape, cache.device)
    _check_float_tensor(append_value, "append_value", kv_shape, cache.device)
    batch_size, seq_lens = _check_cache_and_table(cache, kv_indptr, kv_indices, kv_last_page_len,
                                                  window_slots, rotation, check_bounds)
    _check_int_tensor(qo_indptr, "qo_indptr", 1, cache.device)
    expect(qo_indptr.shape[0] == batch_size + 1, "qo_indptr", f"shape [{batch_size + 1}]",
           qo_indptr)
    if check_bounds:
        qo = qo_indptr.cpu().long()
        chunk = qo[1:] - qo[:-1]
        expect(int(qo[0]) == 0 and int(qo[-1]) == nnz, "qo_indptr",
               f"offsets from 0 to nnz={nnz}", qo.tolist())
        expect(bool((chunk >= 0).all()), "qo_indptr", "non-decreasing offsets", qo.tolist())
        expect(bool((chunk <= seq_lens).all()), "qo_indptr",
               "chunk lengths <= the sequence lengths of the page table", chunk.tolist())
    if out is not None:
        _check_float_tensor(out, "out", tuple(q.shape), cache.device)
        expect(out.dtype == q.dtype, "out", f"dtype {q.dtype}", out, TypeError)
    scale = 1.0 / math.sqrt(spec.head_dim) if sm_scale is None else float(sm_scale)
    rot_k, rot_v = rotation.per_head(spec.num_kv_heads)
    name, fn = _dispatch("extend", backend, cache.device, _config(cache, num_qo_heads, q.dtype))
    kw = {"plan": plan} if plan is not None and name == "triton" else {}
    o, lse = fn(q, append_key, append_value, qo_indptr, cache, kv_indptr, kv_indices,
                kv_last_page_len, window_slots, rot_k, rot_v, float(rotation.k_clip),
                float(rotation.v_clip), scale, out=out, **kw)
    return _finish(o, lse, out, q.dtype, return_lse)

