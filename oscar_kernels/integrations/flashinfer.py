"""FlashInfer-shaped API over the INT2 paged cache: plan/run wrappers and the page helpers.

A serving engine written against FlashInfer swaps one name per call site:

=================================================  ===============================================
FlashInfer                                         oscar_kernels.integrations.flashinfer
=================================================  ===============================================
``BatchDecodeWithPagedKVCacheWrapper``             :class:`Int2BatchDecodeWithPagedKVCacheWrapper`
``BatchPrefillWithPagedKVCacheWrapper``            :class:`Int2BatchPrefillWithPagedKVCacheWrapper`
``append_paged_kv_cache``                          :func:`append_paged_kv_cache`
``get_batch_indices_positions``, ``get_seq_lens``  same names here (:mod:`oscar_kernels.page`)
=================================================  ===============================================

Argument names, order and meaning follow FlashInfer 0.7 (``indptr, indices,
last_page_len`` for decode ``plan``; ``qo_indptr, paged_kv_indptr, paged_kv_indices,
paged_kv_last_page_len`` for prefill ``plan``; NHD/HND layouts; ``lse`` returned in base 2
by default as FlashInfer does). What the INT2 format adds is keyword-only:
``window_slots`` (one window-store slot per sequence, docs/format.md section 5) and
``rotation`` (a :class:`~oscar_kernels.rotation.LayerRotation`; given at ``plan`` as the
default and overridable per layer at ``run``, since one plan serves every layer of a
forward pass). The paged cache passed to ``run`` is an
:class:`~oscar_kernels.cache.Int2PagedKVCache` instead of a ``(k_cache, v_cache)`` pair,
and the prefill ``run`` also takes the chunk's new ``k``/``v`` (extend appends them).

``plan`` runs on the host and is not captured: it checks the page table once (bounds,
monotonic offsets, distinct window slots), keeps the largest page id and slot as Python
ints, copies the tables into persistent buffers when ``use_cuda_graph=True`` (the
buffers are then the ones a captured graph reads), keeps the decode batch's longest
sequence as the CuTe plan's length hint (without ``use_cuda_graph`` only: a captured launch
serves every later length) and resolves the backend. ``run``
never synchronizes with the device: it checks shapes against the plan in Python and calls
the public op with ``check_bounds=False``.
"""

from __future__ import annotations

import math

import torch

from .. import ops
from ..cache import Int2PagedKVCache
from ..errors import UnsupportedConfigError, expect
from ..page import get_batch_indices_positions, get_seq_lens
from ..rotation import LayerRotation
from ..spec import KV_LAYOUTS, CacheSpec

__all__ = [
    "Int2BatchDecodeWithPagedKVCacheWrapper",
    "Int2BatchPrefillWithPagedKVCacheWrapper",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
]

_LOG2E = 1.0 / math.log(2.0)
_LSE_BASES = ("log2", "ln")


def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor,
                          batch_indices: torch.Tensor, positions: torch.Tensor,
                          paged_kv_cache: Int2PagedKVCache, kv_indices: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                          kv_layout: str = "NHD", *, window_slots: torch.Tensor,
                          rotation: LayerRotation, backend: str = "auto",
                          check_bounds: bool = True) -> None:
    """FlashInfer's ``append_paged_kv_cache`` for the INT2 cache (rotate, quantize, store).

    Parameters
    ----------
    append_key, append_value : Tensor ``[nnz, num_kv_heads, head_dim]``
        New tokens in the model's space (bf16, fp16 or fp32).
    batch_indices, positions : Tensor ``[nnz]`` int32
        From :func:`get_batch_indices_positions`.
    paged_kv_cache : Int2PagedKVCache
        Written in place (INT2 pages of every token, BF16 sink and recent-ring rows).
    kv_indices, kv_indptr, kv_last_page_len : Tensor int32
        The page table ``[kv_indptr[-1]]``, ``[batch_size + 1]``, ``[batch_size]``, already
        covering the new tokens.
    kv_layout : {"NHD", "HND"}
        Must equal ``paged_kv_cache.spec.kv_layout`` (the cache carries its layout).
    window_slots : Tensor ``[batch_size]`` int32
        Window-store slot of each sequence.
    rotation : LayerRotation
        This layer's rotations and clip ratios.
    backend, check_bounds
        As in :func:`oscar_kernels.ops.quantize_append_paged_kv_cache`; pass
        ``check_bounds=False`` inside CUDA-graph capture.

    Example
    -------
    >>> import torch
    >>> from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation
    >>> cache = Int2PagedKVCache.allocate(CacheSpec(num_kv_heads=2, head_dim=64, page_size=16),
    ...                                   num_pages=4, num_window_slots=1)
    >>> k, v = torch.randn(2, 20, 2, 64, dtype=torch.bfloat16)
    >>> i32 = lambda *x: torch.tensor(x, dtype=torch.int32)
    >>> b, p = get_batch_indices_positions(i32(0, 20), i32(20), 20)
    >>> append_paged_kv_cache(k, v, b, p, cache, i32(3, 1), i32(0, 2), i32(4),
    ...                       window_slots=i32(0), rotation=LayerRotation.hadamard(64))
    """
    expect(isinstance(paged_kv_cache, Int2PagedKVCache), "paged_kv_cache",
           "an Int2PagedKVCache", paged_kv_cache, TypeError)
    expect(kv_layout == paged_kv_cache.spec.kv_layout, "kv_layout",
           f"{paged_kv_cache.spec.kv_layout!r} (the cache's layout)", kv_layout)
    ops.quantize_append_paged_kv_cache(append_key, append_value, batch_indices, positions,
                                       paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len,
                                       window_slots, rotation, backend=backend,
                                       check_bounds=check_bounds)


# ---------------------------------------------------------------------- planning
def _host_i32(t, name: str) -> torch.Tensor:
    expect(isinstance(t, torch.Tensor), name, "a torch.Tensor", t, TypeError)
    expect(t.dtype == torch.int32, name, "dtype torch.int32", t, TypeError)
    expect(t.dim() == 1, name, "a 1-D tensor", t)
    return t.detach().to("cpu", torch.int64)


def _check_table(indptr, indices, last_page_len, window_slots, page_size: int,
                 num_rows_name: str = "indptr") -> dict:
    """Host-side checks of a page table; returns Python ints the run-time checks use."""
    ip = _host_i32(indptr, num_rows_name)
    expect(ip.shape[0] >= 2, num_rows_name, "shape [batch_size + 1] with batch_size >= 1", indptr)
    batch_size = ip.shape[0] - 1
    idx = _host_i32(indices, "indices")
    last = _host_i32(last_page_len, "last_page_len")
    slots = _host_i32(window_slots, "window_slots")
    expect(int(ip[0]) == 0, f"{num_rows_name}[0]", "0", int(ip[0]))
    counts = ip[1:] - ip[:-1]
    expect(bool((counts >= 0).all()), num_rows_name, "non-decreasing offsets", ip.tolist())
    expect(int(ip[-1]) <= idx.shape[0], f"{num_rows_name}[-1]",
           f"<= len(indices) = {idx.shape[0]}", int(ip[-1]))
    expect(last.shape[0] == batch_size, "last_page_len", f"shape [{batch_size}]", last_page_len)
    expect(slots.shape[0] == batch_size, "window_slots", f"shape [{batch_size}]", window_slots)
    used = idx[: int(ip[-1])]
    expect(used.numel() == 0 or int(used.min()) >= 0, "indices", "non-negative page ids",
           used.tolist()[:16])
    ok = torch.where(counts > 0, (last >= 1) & (last <= page_size), last == 0)
    expect(bool(ok.all()), "last_page_len",
           f"values in [1, {page_size}] (0 for a sequence without pages)", last.tolist())
    expect(bool((slots >= 0).all()), "window_slots", "non-negative slots", slots.tolist())
    expect(slots.unique().numel() == batch_size, "window_slots", "distinct slots per sequence",
           slots.tolist())
    seq_lens = torch.where(counts > 0, (counts - 1).clamp(min=0) * page_size + last,
                           torch.zeros_like(last))
    return {
        "batch_size": batch_size,
        "nnz_pages": int(ip[-1]),
        "max_page": int(used.max()) if used.numel() else -1,
        "max_slot": int(slots.max()),
        "seq_lens": seq_lens,
    }


class _PlannedWrapper:
    """What the decode and prefill wrappers share: buffers, plan state, run-time checks."""

    _kind = ""

    def __init__(self, workspace_buffer: torch.Tensor, kv_layout: str, use_cuda_graph: bool,
                 backend: str):
        expect(isinstance(workspace_buffer, torch.Tensor), "workspace_buffer",
               "a torch.Tensor (FlashInfer's float workspace; kept for device placement)",
               workspace_buffer, TypeError)
        expect(kv_layout in KV_LAYOUTS, "kv_layout", f"one of {KV_LAYOUTS}", kv_layout)
        expect(backend in ops.BACKENDS + ("auto",), "backend",
               f"one of {ops.BACKENDS + ('auto',)}", backend)
        self._workspace = workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend_request = backend
        self._plan: dict | None = None
        self._backend_by_spec: dict = {}

    @property
    def device(self) -> torch.device:
        return self._workspace.device

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def resolved_backend(self) -> str | None:
        """Backend picked for the last spec seen (``None`` before the first plan with a
        ``spec`` or the first run)."""
        if not self._backend_by_spec:
            return None
        return list(self._backend_by_spec.values())[-1]

    def reset_workspace_buffer(self, workspace_buffer: torch.Tensor, *buffers) -> None:
        """FlashInfer's hook for reallocating the workspace; only placement matters here."""
        expect(isinstance(workspace_buffer, torch.Tensor), "workspace_buffer", "a torch.Tensor",
               workspace_buffer, TypeError)
        self._workspace = workspace_buffer

    # -------------------------------------------------------------- buffers
    def _store(self, attr: str, src: torch.Tensor, non_blocking: bool,
               exact_len: bool) -> torch.Tensor:
        """Copy ``src`` to the device; in graph mode into the persistent buffer ``attr``."""
        if not self._use_cuda_graph:
            return src.to(self.device, non_blocking=non_blocking)
        buf, name = getattr(self, attr), self._buffer_names[attr]
        if exact_len:
            expect(buf.shape[0] == src.shape[0], name,
                   f"length {src.shape[0]} (the batch size is fixed under CUDA graphs)", buf)
            buf.copy_(src, non_blocking=non_blocking)
            return buf
        expect(buf.shape[0] >= src.shape[0], name,
               f"capacity >= {src.shape[0]} (len of the planned table)", buf)
        buf[: src.shape[0]].copy_(src, non_blocking=non_blocking)
        return buf

    def _graph_buffers(self, buffers: dict) -> None:
        """``buffers``: argument name -> (attribute, tensor or None)."""
        self._buffer_names = getattr(self, "_buffer_names", {})
        for name, (attr, t) in buffers.items():
            self._buffer_names[attr] = name
            if self._use_cuda_graph:
                expect(isinstance(t, torch.Tensor) and t.dtype == torch.int32, name,
                       "an int32 torch.Tensor in cudagraph mode", t, ValueError)
                expect(t.device == self.device, name, f"device {self.device} (the workspace's)",
                       t.device)
            setattr(self, attr, t if self._use_cuda_graph else None)

    # ----------------------------------------------------------- run checks
    def _resolve_backend(self, spec: CacheSpec, num_qo_heads: int, dtype: torch.dtype,
                         op: str) -> str:
        key = (spec, num_qo_heads, dtype)
        name = self._backend_by_spec.get(key)
        if name is None:
            name, _ = ops._dispatch(op, self._backend_request, self.device,
                                    {"spec": spec, "num_qo_heads": num_qo_heads, "dtype": dtype})
            self._backend_by_spec[key] = name
        return name

    def _check_run(self, cache, rotation) -> tuple[dict, LayerRotation]:
        plan = self._plan
        expect(plan is not None, "plan", f"a call to {self._kind}.plan() before run()", None,
               RuntimeError)
        expect(isinstance(cache, Int2PagedKVCache), "paged_kv_cache", "an Int2PagedKVCache",
               cache, TypeError)
        spec = cache.spec
        for field, want in (("num_kv_heads", plan["num_kv_heads"]),
                            ("head_dim", plan["head_dim"]), ("page_size", plan["page_size"]),
                            ("kv_layout", self._kv_layout)):
            expect(getattr(spec, field) == want, f"paged_kv_cache.spec.{field}",
                   f"{want!r} (as planned)", getattr(spec, field))
        if plan["spec"] is not None:
            expect(spec == plan["spec"], "paged_kv_cache.spec", f"{plan['spec']} (as planned)",
                   spec)
        expect(plan["max_page"] < cache.num_pages, "paged_kv_cache",
               f"more than {plan['max_page']} pages (the planned table's largest page id)",
               f"{cache.num_pages} pages")
        expect(plan["max_slot"] < cache.num_window_slots, "paged_kv_cache",
               f"more than {plan['max_slot']} window slots (the planned largest slot)",
               f"{cache.num_window_slots} slots")
        expect(cache.device == self.device, "paged_kv_cache", f"device {self.device}",
               cache.device)
        rot = plan["rotation"] if rotation is None else rotation
        expect(isinstance(rot, LayerRotation), "rotation",
               "a LayerRotation (at plan() or run())", rot, TypeError)
        if rot.rot_k.device != self.device:
            rot = rot.to(self.device)
        return plan, rot

    @staticmethod
    def _lse(result, return_lse: bool, lse_base: str, lse_out):
        if not return_lse:
            return result
        o, lse = result
        if lse_base == "log2":
            lse = lse * _LOG2E
        if lse_out is not None:
            lse_out.copy_(lse)
            lse = lse_out
        return o, lse

    def _common_plan(self, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale, rotation,
                     spec) -> dict:
        for name, v in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("page_size", page_size)):
            expect(isinstance(v, int) and v > 0, name, "a positive int", v)
        expect(num_qo_heads % num_kv_heads == 0, "num_qo_heads",
               f"a multiple of num_kv_heads={num_kv_heads}", num_qo_heads)
        if rotation is not None:
            expect(isinstance(rotation, LayerRotation), "rotation", "a LayerRotation", rotation,
                   TypeError)
            expect(rotation.rot_k.shape[-1] == head_dim
                   and rotation.rot_k.shape[0] in (1, num_kv_heads), "rotation.rot_k",
                   f"shape [1 or {num_kv_heads}, {head_dim}, {head_dim}]", rotation.rot_k)
            rotation = rotation.to(self.device)
        if spec is not None:
            expect(isinstance(spec, CacheSpec), "spec", "a CacheSpec", spec, TypeError)
            for field, v in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                             ("page_size", page_size), ("kv_layout", self._kv_layout)):
                expect(getattr(spec, field) == v, f"spec.{field}", f"{v!r}", getattr(spec, field))
        scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
        expect(math.isfinite(scale) and scale > 0, "sm_scale", "a positive finite float", sm_scale)
        return {"num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads,
                "head_dim": head_dim, "page_size": page_size, "sm_scale": scale,
                "rotation": rotation, "spec": spec}


class Int2BatchDecodeWithPagedKVCacheWrapper(_PlannedWrapper):
    """FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` for the INT2 cache.

    Parameters
    ----------
    workspace_buffer : Tensor
        FlashInfer's float workspace. The INT2 ops need none; it fixes the device and keeps
        the constructor call identical.
    kv_layout : {"NHD", "HND"}
    use_cuda_graph : bool
        Fix the batch size and read the page table from the persistent buffers below
        (``plan`` copies into them, a captured ``run`` reads them).
    use_tensor_cores : bool
        Accepted for call compatibility; the backends choose their own MMA path.
    paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer : Tensor
        int32 ``[batch_size + 1]``, ``[max_num_pages]``, ``[batch_size]``; required when
        ``use_cuda_graph``, as in FlashInfer.
    window_slots_buffer : Tensor, optional
        int32 ``[batch_size]``; allocated on the workspace's device when omitted.
    backend : {"auto", "reference", "triton", "cute"}

    Example
    -------
    >>> import torch
    >>> from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation
    >>> spec = CacheSpec(num_kv_heads=2, head_dim=64, page_size=16)
    >>> cache = Int2PagedKVCache.allocate(spec, num_pages=4, num_window_slots=1)
    >>> i32 = lambda *x: torch.tensor(x, dtype=torch.int32)
    >>> rot = LayerRotation.hadamard(64)
    >>> k, v = torch.randn(2, 20, 2, 64, dtype=torch.bfloat16)
    >>> b, p = get_batch_indices_positions(i32(0, 20), i32(20), 20)
    >>> append_paged_kv_cache(k, v, b, p, cache, i32(3, 1), i32(0, 2), i32(4),
    ...                       window_slots=i32(0), rotation=rot)
    >>> w = Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(0))
    >>> w.plan(i32(0, 2), i32(3, 1), i32(4), 4, 2, 64, 16, window_slots=i32(0), rotation=rot)
    >>> w.run(torch.randn(1, 4, 64, dtype=torch.bfloat16), cache).shape
    torch.Size([1, 4, 64])
    """

    _kind = "Int2BatchDecodeWithPagedKVCacheWrapper"

    def __init__(self, workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: torch.Tensor | None = None,
                 paged_kv_indices_buffer: torch.Tensor | None = None,
                 paged_kv_last_page_len_buffer: torch.Tensor | None = None, *,
                 window_slots_buffer: torch.Tensor | None = None,
                 backend: str = "auto") -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph, backend)
        self._use_tensor_cores = bool(use_tensor_cores)
        self._graph_buffers({
            "paged_kv_indptr_buffer": ("_paged_kv_indptr_buf", paged_kv_indptr_buffer),
            "paged_kv_indices_buffer": ("_paged_kv_indices_buf", paged_kv_indices_buffer),
            "paged_kv_last_page_len_buffer": ("_paged_kv_last_page_len_buf",
                                              paged_kv_last_page_len_buffer)})
        if self._use_cuda_graph:
            self._fixed_batch_size = paged_kv_last_page_len_buffer.shape[0]
            expect(paged_kv_indptr_buffer.shape[0] == self._fixed_batch_size + 1,
                   "paged_kv_indptr_buffer", f"length {self._fixed_batch_size + 1} "
                   "(len(paged_kv_last_page_len_buffer) + 1)", paged_kv_indptr_buffer)
            if window_slots_buffer is None:
                window_slots_buffer = torch.zeros(self._fixed_batch_size, dtype=torch.int32,
                                                  device=self.device)
            self._graph_buffers({"window_slots_buffer": ("_window_slots_buf",
                                                          window_slots_buffer)})
        else:
            self._fixed_batch_size = 0
            self._graph_buffers({"window_slots_buffer": ("_window_slots_buf", None)})

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
             window_slots: torch.Tensor, rotation: LayerRotation | None = None,
             sm_scale: float | None = None, spec: CacheSpec | None = None,
             q_data_type: torch.dtype | str = torch.bfloat16, kv_data_type=None,
             o_data_type=None, pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: float | None = None, non_blocking: bool = True,
             **unsupported) -> None:
        """Check the page table once and stage it for :meth:`run` (host side, not captured).

        Parameters
        ----------
        indptr, indices, last_page_len : Tensor int32
            FlashInfer page table ``[batch_size + 1]``, ``[indptr[-1]]``, ``[batch_size]``
            (host or device; read on the host here).
        num_qo_heads, num_kv_heads, head_dim, page_size : int
        window_slots : Tensor ``[batch_size]`` int32
            Window-store slot of each sequence (distinct).
        rotation : LayerRotation, optional
            Default rotation for :meth:`run` (a run may pass its own layer's).
        sm_scale : float, optional
            Default ``1 / sqrt(head_dim)``.
        spec : CacheSpec, optional
            When given, the backend is resolved now and ``run`` requires a cache of this spec;
            otherwise it is resolved (in Python, once per spec) at the first ``run``.
        q_data_type : torch.dtype
            Used to resolve the backend with ``spec``.
        kv_data_type, o_data_type, non_blocking
            Accepted for call compatibility (the cache fixes its own dtypes; outputs take
            ``q.dtype``).
        pos_encoding_mode, window_left, logits_soft_cap
            Only FlashInfer's defaults (``"NONE"``, ``-1``, ``None``/``0``) are supported:
            anything else raises :class:`UnsupportedConfigError`.
        """
        _reject_unsupported(pos_encoding_mode, window_left, logits_soft_cap, unsupported)
        plan = self._common_plan(num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale,
                                 rotation, spec)
        table = _check_table(indptr, indices, last_page_len, window_slots, page_size)
        if self._use_cuda_graph:
            expect(table["batch_size"] == self._fixed_batch_size, "indptr",
                   f"batch_size {self._fixed_batch_size} (fixed under CUDA graphs)",
                   table["batch_size"])
        plan.update(table)
        # the longest sequence as the CuTe plan's length hint (fewer splits, a shallower copy
        # ring for short batches); not under CUDA graphs, where a launch captured at one
        # (often dummy) length replays at every later one
        plan["max_kv_len"] = (None if self._use_cuda_graph or not table["seq_lens"].numel()
                              else int(table["seq_lens"].max()))
        plan["indptr"] = self._store("_paged_kv_indptr_buf", indptr, non_blocking, True)
        plan["indices"] = self._store("_paged_kv_indices_buf", indices, non_blocking, False)
        plan["last_page_len"] = self._store("_paged_kv_last_page_len_buf", last_page_len,
                                            non_blocking, True)
        plan["window_slots"] = self._store("_window_slots_buf", window_slots, non_blocking, True)
        if spec is not None:
            self._resolve_backend(spec, num_qo_heads, _as_dtype(q_data_type), "decode")
        self._plan = plan

    def run(self, q: torch.Tensor, paged_kv_cache: Int2PagedKVCache, *,
            rotation: LayerRotation | None = None, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, return_lse: bool = False,
            lse_base: str = "log2"):
        """Decode attention for the planned batch (graph-safe: no host sync).

        Parameters
        ----------
        q : Tensor ``[batch_size, num_qo_heads, head_dim]``
        paged_kv_cache : Int2PagedKVCache
            This layer's cache, of the planned geometry.
        rotation : LayerRotation, optional
            This layer's rotation (default: the planned one), already on the device to avoid
            a copy per call.
        out : Tensor, optional
            ``[batch_size, num_qo_heads, head_dim]`` of ``q.dtype``, written in place.
        lse : Tensor, optional
            ``[batch_size, num_qo_heads]`` float32, written in place when ``return_lse``.
        return_lse : bool
        lse_base : {"log2", "ln"}
            Base of the returned log-sum-exp; FlashInfer's default is base 2.

        Returns
        -------
        Tensor ``[batch_size, num_qo_heads, head_dim]`` (and the lse ``[batch_size,
        num_qo_heads]`` float32 when ``return_lse``).
        """
        expect(lse_base in _LSE_BASES, "lse_base", f"one of {_LSE_BASES}", lse_base)
        plan, rot = self._check_run(paged_kv_cache, rotation)
        expect(isinstance(q, torch.Tensor) and tuple(q.shape) == (
            plan["batch_size"], plan["num_qo_heads"], plan["head_dim"]), "q",
            f"shape ({plan['batch_size']}, {plan['num_qo_heads']}, {plan['head_dim']}) "
            "(as planned)", q)
        backend = self._resolve_backend(paged_kv_cache.spec, plan["num_qo_heads"], q.dtype,
                                        "decode")
        result = ops.paged_decode_attention(
            q, paged_kv_cache, plan["indptr"], plan["indices"], plan["last_page_len"],
            plan["window_slots"], rot, sm_scale=plan["sm_scale"], out=out,
            return_lse=return_lse, backend=backend, check_bounds=False,
            max_kv_len=plan["max_kv_len"])
        return self._lse(result, return_lse, lse_base, lse)

    forward = run


class Int2BatchPrefillWithPagedKVCacheWrapper(_PlannedWrapper):
    """FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` for the INT2 cache (extend).

    ``run`` appends the chunk's K/V (quantized into the pages, BF16 into the window slot)
    and attends causally with the chunk's queries: prefill, chunked prefill and prefix-cache
    hits alike. Constructor arguments as in
    :class:`Int2BatchDecodeWithPagedKVCacheWrapper`, plus ``qo_indptr_buf``
    (int32 ``[batch_size + 1]``) under CUDA graphs.

    Example
    -------
    >>> import torch
    >>> from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation
    >>> cache = Int2PagedKVCache.allocate(CacheSpec(num_kv_heads=2, head_dim=64, page_size=16),
    ...                                   num_pages=4, num_window_slots=1)
    >>> i32 = lambda *x: torch.tensor(x, dtype=torch.int32)
    >>> w = Int2BatchPrefillWithPagedKVCacheWrapper(torch.empty(0))
    >>> w.plan(i32(0, 20), i32(0, 2), i32(3, 1), i32(4), 4, 2, 64, 16,
    ...        window_slots=i32(0), rotation=LayerRotation.hadamard(64))
    >>> q = torch.randn(20, 4, 64, dtype=torch.bfloat16)
    >>> k, v = torch.randn(2, 20, 2, 64, dtype=torch.bfloat16)
    >>> w.run(q, k, v, cache).shape
    torch.Size([20, 4, 64])
    """

    _kind = "Int2BatchPrefillWithPagedKVCacheWrapper"

    def __init__(self, workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf: torch.Tensor | None = None,
                 paged_kv_indptr_buf: torch.Tensor | None = None,
                 paged_kv_indices_buf: torch.Tensor | None = None,
                 paged_kv_last_page_len_buf: torch.Tensor | None = None, *,
                 window_slots_buf: torch.Tensor | None = None,
                 backend: str = "auto") -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph, backend)
        self._graph_buffers({
            "qo_indptr_buf": ("_qo_indptr_buf", qo_indptr_buf),
            "paged_kv_indptr_buf": ("_paged_kv_indptr_buf", paged_kv_indptr_buf),
            "paged_kv_indices_buf": ("_paged_kv_indices_buf", paged_kv_indices_buf),
            "paged_kv_last_page_len_buf": ("_paged_kv_last_page_len_buf",
                                           paged_kv_last_page_len_buf)})
        if self._use_cuda_graph:
            self._fixed_batch_size = paged_kv_last_page_len_buf.shape[0]
            for name, t in (("qo_indptr_buf", qo_indptr_buf),
                            ("paged_kv_indptr_buf", paged_kv_indptr_buf)):
                expect(t.shape[0] == self._fixed_batch_size + 1, name,
                       f"length {self._fixed_batch_size + 1}", t)
            if window_slots_buf is None:
                window_slots_buf = torch.zeros(self._fixed_batch_size, dtype=torch.int32,
                                               device=self.device)
            self._graph_buffers({"window_slots_buf": ("_window_slots_buf", window_slots_buf)})
        else:
            self._fixed_batch_size = 0
            self._graph_buffers({"window_slots_buffer": ("_window_slots_buf", None)})

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
             paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int,
             head_dim_vo: int | None = None, custom_mask=None, packed_custom_mask=None,
             causal: bool = True, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale: float | None = None,
             window_left: int = -1, logits_soft_cap: float | None = None, *,
             window_slots: torch.Tensor, rotation: LayerRotation | None = None,
             spec: CacheSpec | None = None,
             q_data_type: torch.dtype | str = torch.bfloat16, kv_data_type=None,
             o_data_type=None, non_blocking: bool = True, **unsupported) -> None:
        """Check the tables once and stage them for :meth:`run` (host side, not captured).

        Parameters
        ----------
        qo_indptr : Tensor ``[batch_size + 1]`` int32
            Offsets of each sequence's new tokens; ``qo_indptr[-1] == nnz``.
        paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len : Tensor int32
            Page table covering the new tokens (lengths after the append).
        num_qo_heads, num_kv_heads, head_dim_qk, page_size : int
        head_dim_vo : int, optional
            Must equal ``head_dim_qk`` when given.
        causal : bool
            Only ``True`` (the INT2 extend is causal); default ``True`` here, FlashInfer's
            default is ``False``.
        custom_mask, packed_custom_mask, pos_encoding_mode, window_left, logits_soft_cap
            Only their defaults are supported (:class:`UnsupportedConfigError` otherwise).
        window_slots, rotation, sm_scale, spec, q_data_type
            As in :meth:`Int2BatchDecodeWithPagedKVCacheWrapper.plan`.
        """
        _reject_unsupported(pos_encoding_mode, window_left, logits_soft_cap, unsupported)
        if not causal:
            raise UnsupportedConfigError("causal: the INT2 extend attention is causal only; "
                                         "got causal=False")
        if custom_mask is not None or packed_custom_mask is not None:
            raise UnsupportedConfigError("custom_mask: custom attention masks are not "
                                         "supported by the INT2 extend attention")
        expect(head_dim_vo is None or head_dim_vo == head_dim_qk, "head_dim_vo",
               f"None or {head_dim_qk} (head_dim_qk)", head_dim_vo)
        plan = self._common_plan(num_qo_heads, num_kv_heads, head_dim_qk, page_size, sm_scale,
                                 rotation, spec)
        table = _check_table(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                             window_slots, page_size, "paged_kv_indptr")
        qo = _host_i32(qo_indptr, "qo_indptr")
        expect(qo.shape[0] == table["batch_size"] + 1, "qo_indptr",
               f"shape [{table['batch_size'] + 1}]", qo_indptr)
        chunk = qo[1:] - qo[:-1]
        expect(int(qo[0]) == 0 and bool((chunk >= 0).all()), "qo_indptr",
               "non-decreasing offsets from 0", qo.tolist())
        expect(bool((chunk <= table["seq_lens"]).all()), "qo_indptr",
               "chunk lengths <= the sequence lengths of the page table",
               f"chunks {chunk.tolist()} vs lengths {table['seq_lens'].tolist()}")
        if self._use_cuda_graph:
            expect(table["batch_size"] == self._fixed_batch_size, "paged_kv_indptr",
                   f"batch_size {self._fixed_batch_size} (fixed under CUDA graphs)",
                   table["batch_size"])
        plan.update(table)
        plan["nnz"] = int(qo[-1])
        plan["qo_indptr"] = self._store("_qo_indptr_buf", qo_indptr, non_blocking, True)
        plan["indptr"] = self._store("_paged_kv_indptr_buf", paged_kv_indptr, non_blocking, True)
        plan["indices"] = self._store("_paged_kv_indices_buf", paged_kv_indices, non_blocking,
                                      False)
        plan["last_page_len"] = self._store("_paged_kv_last_page_len_buf", paged_kv_last_page_len,
                                            non_blocking, True)
        plan["window_slots"] = self._store("_window_slots_buf", window_slots, non_blocking, True)
        if spec is not None:
            self._resolve_backend(spec, num_qo_heads, _as_dtype(q_data_type), "extend")
        self._plan = plan

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            paged_kv_cache: Int2PagedKVCache, *, rotation: LayerRotation | None = None,
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
            return_lse: bool = False, lse_base: str = "log2"):
        """Append the chunk and run causal extend attention. The first call after
        :meth:`plan` reads the page table on the host once (one synchronization); the other
        layers of the batch reuse that and run without one.

        Parameters
        ----------
        q : Tensor ``[nnz, num_qo_heads, head_dim]``
        k, v : Tensor ``[nnz, num_kv_heads, head_dim]``
            The chunk's new keys/values in the model's space; appended to the cache.
        paged_kv_cache : Int2PagedKVCache
            This layer's cache, updated in place.
        rotation, out, lse, return_lse, lse_base
            As in :meth:`Int2BatchDecodeWithPagedKVCacheWrapper.run`.

        Returns
        -------
        Tensor ``[nnz, num_qo_heads, head_dim]`` (and the lse ``[nnz, num_qo_heads]``).
        """
        expect(lse_base in _LSE_BASES, "lse_base", f"one of {_LSE_BASES}", lse_base)
        plan, rot = self._check_run(paged_kv_cache, rotation)
        expect(isinstance(q, torch.Tensor) and tuple(q.shape) == (
            plan["nnz"], plan["num_qo_heads"], plan["head_dim"]), "q",
            f"shape ({plan['nnz']}, {plan['num_qo_heads']}, {plan['head_dim']}) (as planned)", q)
        backend = self._resolve_backend(paged_kv_cache.spec, plan["num_qo_heads"], q.dtype,
                                        "extend")
        ext = plan.get("extend_plan")
        if backend != "reference" and (ext is None or ext.spec != paged_kv_cache.spec):
            # the batch's geometry, planned at the first layer and shared by the others
            ext = ops.plan_extend(plan["qo_indptr"], paged_kv_cache, plan["indptr"],
                                  plan["last_page_len"], plan["window_slots"])
            plan["extend_plan"] = ext
        result = ops.paged_extend_attention(
            q, k, v, plan["qo_indptr"], paged_kv_cache, plan["indptr"], plan["indices"],
            plan["last_page_len"], plan["window_slots"], rot, sm_scale=plan["sm_scale"],
            out=out, return_lse=return_lse, backend=backend, check_bounds=False, plan=ext)
        return self._lse(result, return_lse, lse_base, lse)

    forward = run


def _as_dtype(d) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    expect(isinstance(d, str) and isinstance(getattr(torch, d, None), torch.dtype),
           "q_data_type", "a torch.dtype or its name", d, TypeError)
    return getattr(torch, d)


def _reject_unsupported(pos_encoding_mode, window_left, logits_soft_cap, extra: dict) -> None:
    if pos_encoding_mode != "NONE":
        raise UnsupportedConfigError(f"pos_encoding_mode: only 'NONE' is supported (apply RoPE "
                                     f"before the cache), got {pos_encoding_mode!r}")
    if window_left != -1:
        raise UnsupportedConfigError(f"window_left: sliding-window attention is not supported "
                                     f"by the INT2 cache, got {window_left}")
    if logits_soft_cap not in (None, 0, 0.0):
        raise UnsupportedConfigError(f"logits_soft_cap: not supported, got {logits_soft_cap}")
    if extra:
        raise UnsupportedConfigError(f"plan(): arguments not supported by the INT2 wrappers: "
                                     f"{sorted(extra)}")
