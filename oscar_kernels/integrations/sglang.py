"""SGLang plugin: ``--kv-cache-dtype int2`` on stock SGLang, no fork.

Installed by ``pip install oscar-kernels[sglang]``, which registers
:func:`register` under SGLang's ``sglang.srt.plugins`` entry-point group. SGLang calls
``sglang.srt.plugins.load_plugins()`` early in every process (launcher, engine,
scheduler/model workers); :func:`register` then adds hooks through SGLang's
``HookRegistry``:

* ``ServerArgs.add_cli_args`` (after): adds ``int2`` to ``--kv-cache-dtype`` and the flags
  ``--oscar-rotation-path``, ``--oscar-sink-size``, ``--oscar-recent-size``,
  ``--oscar-group-size``, ``--oscar-backend``.
* ``ServerArgs.from_cli_args`` (around): moves the ``--oscar-*`` values into
  ``OSCAR_*`` environment variables (inherited by SGLang's worker processes).
* ``ServerArgs.resolve_once`` (before): turns ``kv_cache_dtype="int2"`` into the model
  dtype for SGLang's own checks, records ``OSCAR_KV_CACHE_DTYPE=int2``, and rejects
  unsupported combinations (pipeline parallel, hierarchical cache, speculative decoding,
  DP attention, a missing artifact) with a clear message at startup.
* ``KVCacheConfigurator._build_mha_kv_pool`` (around): builds
  :class:`~oscar_kernels.integrations.sglang_backend.OscarInt2TokenToKVPool` (one
  :class:`~oscar_kernels.cache.Int2PagedKVCache` per layer, pages of SGLang's
  ``--page-size``) after checking the model (MLA, head_dim a power of two) and loading
  and validating the rotation artifact for this TP rank's KV heads.
* ``attention_backend_setup._build_full_attention_backend_from_str`` (around): returns
  :class:`~oscar_kernels.integrations.sglang_backend.OscarInt2AttnBackend`.
* ``ReqToTokenPool.alloc_rows`` / ``alloc`` (after): marks freshly assigned request rows,
  whose window slots must be rebuilt, and records each row's sink key.
* ``mem_cache.common.match_kv_cache`` (around): cuts a new request's radix-cache hit so
  the window positions are recomputed (:func:`reusable_prefix_len`; docs/integrations.md).
* ``DefaultPoolConfigurator._compute_cell_size`` (around),
  ``DefaultPoolConfigurator.calculate_pool_sizes`` (around) and
  ``KVCacheConfigurator.resolve_max_num_reqs`` (after): the token capacity is the largest
  whose INT2 pages, BF16 window slots (one per request row, the padding row, the spares of
  CUDA-graph padding) and BF16 sink store fit SGLang's KV budget (:func:`int2_memory_plan`);
  request rows are capped at ``tokens / --oscar-tokens-per-request``.
* ``KVCacheConfigurator._build_token_to_kv_pool`` (around): records SGLang's request rows
  so that the INT2 pool allocates the planned window slots (:func:`planned_window_slots`).

This module imports no SGLang code at import time; the pool and backend classes live in
``sglang_backend.py``. The helpers here (configuration, artifact loading, page tables,
window rebuild) are plain torch and tested without SGLang.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass

import torch

from ..errors import ArtifactError, UnsupportedConfigError, expect
from ..reference.paged import gather_int2
from ..rotation import LayerRotation, ModelFingerprint, RotationArtifact
from ..spec import DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE, is_power_of_two
from .tp import kv_head_range, shard_rotation

log = logging.getLogger(__name__)

INT2 = "int2"
ENV = {
    "dtype": "OSCAR_KV_CACHE_DTYPE",
    "rotation_path": "OSCAR_ROTATION_PATH",
    "sink_size": "OSCAR_SINK_SIZE",
    "recent_size": "OSCAR_RECENT_SIZE",
    "group_size": "OSCAR_GROUP_SIZE",
    "backend": "OSCAR_BACKEND",
    "sink_entries": "OSCAR_SINK_ENTRIES",
    "tokens_per_request": "OSCAR_TOKENS_PER_REQUEST",
}
DEFAULT_SINK_ENTRIES = 32
DEFAULT_TOKENS_PER_REQUEST = 2048


# ------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class OscarConfig:
    """The plugin's settings (from the ``--oscar-*`` flags via ``OSCAR_*`` variables)."""

    rotation_path: str | None = None
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    group_size: int | None = None
    backend: str = "auto"
    sink_entries: int = DEFAULT_SINK_ENTRIES
    tokens_per_request: int = DEFAULT_TOKENS_PER_REQUEST

    @classmethod
    def from_env(cls, environ=None) -> "OscarConfig":
        env = os.environ if environ is None else environ

        def as_int(key, default):
            raw = env.get(ENV[key])
            if raw in (None, ""):
                return default
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{ENV[key]}: expected an integer, got {raw!r}") from None

        return cls(rotation_path=env.get(ENV["rotation_path"]) or None,
                   sink_size=as_int("sink_size", DEFAULT_SINK_SIZE),
                   recent_size=as_int("recent_size", DEFAULT_RECENT_SIZE),
                   group_size=as_int("group_size", None),
                   backend=env.get(ENV["backend"]) or "auto",
                   sink_entries=as_int("sink_entries", DEFAULT_SINK_ENTRIES),
                   tokens_per_request=as_int("tokens_per_request", DEFAULT_TOKENS_PER_REQUEST))

    def to_env(self, environ=None) -> None:
        env = os.environ if environ is None else environ
        env[ENV["dtype"]] = INT2
        for key in ("rotation_path", "sink_size", "recent_size", "group_size", "backend",
                    "sink_entries", "tokens_per_request"):
            val = getattr(self, key)
            if val is None:
                env.pop(ENV[key], None)
            else:
                env[ENV[key]] = str(val)

    def validate(self) -> None:
        expect(self.sink_size >= 0, "--oscar-sink-size", "a non-negative int", self.sink_size)
        expect(self.recent_size >= 0, "--oscar-recent-size", "a non-negative int",
               self.recent_size)
        expect(self.sink_entries >= 0, "--oscar-sink-cache-entries",
               "a non-negative int (0 turns the sink store off)", self.sink_entries)
        expect(self.tokens_per_request >= 1, "--oscar-tokens-per-request", "a positive int",
               self.tokens_per_request)
        expect(self.backend in ("auto", "reference", "triton", "cute"), "--oscar-backend",
               "one of auto, reference, triton, cute", self.backend)
        if self.rotation_path is not None:
            expect(os.path.exists(self.rotation_path), "--oscar-rotation-path",
                   "an existing .safetensors file or a directory", self.rotation_path,
                   ArtifactError)


def int2_enabled(environ=None) -> bool:
    """Whether this process serves with the INT2 cache (set by the ``ServerArgs`` hook)."""
    env = os.environ if environ is None else environ
    return env.get(ENV["dtype"]) == INT2


# --------------------------------------------------------------------- startup checks
def check_server_args(server_args) -> None:
    """Reject what the INT2 plugin does not support, before any model is loaded."""
    problems = []
    if int(getattr(server_args, "pp_size", 1) or 1) > 1:
        problems.append(f"pipeline parallelism (--pp-size {server_args.pp_size}): use "
                        "--tp only")
    if getattr(server_args, "enable_hierarchical_cache", False):
        problems.append("--enable-hierarchical-cache: the host tier would copy INT2 pages "
                        "without the per-request BF16 windows")
    if getattr(server_args, "speculative_algorithm", None):
        problems.append(f"speculative decoding ({server_args.speculative_algorithm}): "
                        "draft/verify attention is not implemented")
    if int(getattr(server_args, "dp_size", 1) or 1) > 1 and getattr(
            server_args, "enable_dp_attention", False):
        problems.append("DP attention")
    if problems:
        raise UnsupportedConfigError("--kv-cache-dtype int2 does not support: "
                                     + "; ".join(problems))


def check_model(*, use_mla: bool, head_dim: int, v_head_dim: int | None,
                architecture: str = "") -> None:
    """Reject models the INT2 cache cannot hold, with the reason."""
    if use_mla:
        raise UnsupportedConfigError(f"--kv-cache-dtype int2: MLA models ({architecture}) "
                                     "keep a latent cache, not per-head K/V; not supported")
    if not (is_power_of_two(head_dim) and head_dim >= 16):
        raise UnsupportedConfigError(f"--kv-cache-dtype int2: head_dim must be a power of two "
                                     f">= 16 (Hadamard rotation, 4-way packing), got {head_dim}")
    if v_head_dim not in (None, head_dim):
        raise UnsupportedConfigError(f"--kv-cache-dtype int2: v_head_dim ({v_head_dim}) must "
                                     f"equal head_dim ({head_dim})")


# ------------------------------------------------------------------------- artifacts
def load_rotation_artifact(path: str | None, fingerprint: ModelFingerprint) -> RotationArtifact:
    """Load and validate the rotations for a model.

    ``path`` is an artifact ``.safetensors`` file, or a directory holding exactly one such
    file, or a directory holding the reference RotationZoo pair ``k_rotation_*.pt`` /
    ``v_rotation_*.pt`` (converted with :meth:`RotationArtifact.from_reference_zoo`).
    ``None`` gives the calibration-free Hadamard rotation (logged as a warning).
    Raises :class:`ArtifactError` naming the file and the mismatch.
    """
    if path is None:
        log.warning("oscar int2: no --oscar-rotation-path; using the calibration-free "
                    "Hadamard rotation (lower quality than a calibrated artifact)")
        return RotationArtifact.hadamard(fingerprint)
    if os.path.isdir(path):
        st = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        ks = sorted(glob.glob(os.path.join(path, "k_rotation_*.pt")))
        vs = sorted(glob.glob(os.path.join(path, "v_rotation_*.pt")))
        if len(st) == 1:
            art = RotationArtifact.load(st[0])
        elif len(st) > 1:
            raise ArtifactError(f"--oscar-rotation-path {path}: expected one .safetensors "
                                f"artifact, found {len(st)}: {[os.path.basename(s) for s in st]}")
        elif len(ks) == 1 and len(vs) == 1:
            art = RotationArtifact.from_reference_zoo(
                ks[0], vs[0], num_kv_heads=fingerprint.num_kv_heads,
                num_qo_heads=fingerprint.num_qo_heads)
        else:
            raise ArtifactError(f"--oscar-rotation-path {path}: expected a .safetensors "
                                "artifact or one k_rotation_*.pt / v_rotation_*.pt pair, "
                                f"found {sorted(os.listdir(path))[:10]}")
    else:
        art = RotationArtifact.load(path)
    art.check_model(fingerprint)
    return art


def rank_rotations(artifact: RotationArtifact, *, tp_rank: int, tp_size: int,
                   start_layer: int = 0, end_layer: int | None = None,
                   device=None) -> list[LayerRotation]:
    """Rotations of this rank's KV heads for layers ``[start_layer, end_layer]``, on ``device``."""
    fp = artifact.fingerprint
    h0, h1 = kv_head_range(tp_rank, tp_size, fp.num_kv_heads)
    end = fp.num_layers - 1 if end_layer is None else end_layer
    return [shard_rotation(artifact.layer(i), h0, h1, fp.num_kv_heads).to(device)
            for i in range(start_layer, end + 1)]


# ----------------------------------------------------------------------- page tables
def page_table_from_req_to_token(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                                 seq_lens: torch.Tensor, page_size: int, *,
                                 seq_lens_cpu: torch.Tensor | None = None):
    """FlashInfer page table from SGLang's token-granular ``req_to_token`` rows.

    SGLang stores, per request row, the token slot of every position; pages are
    ``page_size`` consecutive slots, so page id = slot // page_size and the first slot of
    each page is at positions ``0, page_size, 2 * page_size, ...``.

    Parameters
    ----------
    req_to_token : Tensor ``[num_rows, max_context_len]`` int32
    req_pool_indices : Tensor ``[batch_size]``
    seq_lens : Tensor ``[batch_size]``
        Lengths after this forward's tokens.
    page_size : int
    seq_lens_cpu : Tensor, optional
        Host copy of ``seq_lens`` (SGLang keeps one); avoids a device sync.

    Returns
    -------
    ``kv_indptr [batch_size + 1]``, ``kv_indices [sum(num_pages)]``,
    ``kv_last_page_len [batch_size]``, all int32 on ``req_to_token.device``.
    """
    dev = req_to_token.device
    lens = (seq_lens if seq_lens_cpu is None else seq_lens_cpu).to("cpu", torch.int64)
    pages = (lens + page_size - 1) // page_size
    kv_indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.cumsum(pages, 0)
    rows = req_pool_indices.to(dev, torch.int64)
    max_pages = int(pages.max()) if len(lens) else 0
    cols = torch.arange(max_pages, device=dev) * page_size
    table = req_to_token[rows][:, cols] if max_pages else req_to_token[rows][:, :0]
    mask = torch.arange(max_pages, device=dev)[None, :] < pages.to(dev)[:, None]
    kv_indices = (table[mask].to(torch.int64) // page_size).to(torch.int32)
    last = torch.where(pages > 0, (lens - 1) % page_size + 1, torch.zeros_like(lens))
    return (kv_indptr.to(dev, torch.int32), kv_indices, last.to(dev, torch.int32))


def rebuild_window_from_pages(cache, pages: torch.Tensor, window_slot: int,
                              prefix_len: int, *, sinks: bool = True) -> None:
    """Fill a request's window slot for a reused prefix of ``prefix_len`` tokens from pages.

    The slot of a request that starts on a cached prefix holds another request's rows.
    The recent rows ``[max(S, P - W), P)`` (and, with ``sinks``, the sink rows
    ``[0, min(S, P))``) are rewritten from the shared INT2 pages (dequantized, rotated
    space, as BF16), so nothing stale is ever read. These rows carry INT2 precision; the
    plugin only lets queries that SGLang recomputes read them (docs/integrations.md).
    """
    spec = cache.spec
    s, w = spec.sink_size, spec.recent_size
    if prefix_len <= 0:
        return
    k, v = gather_int2(cache, pages, prefix_len)
    pos = torch.arange(prefix_len, device=k.device)
    keep = ((pos < s) & sinks) | ((pos >= max(s, prefix_len - w)) & (w > 0))
    pos = pos[keep]
    rows = torch.where(pos < s, pos, s + (pos % w if w > 0 else pos))
    cache.k_window[window_slot, rows] = k[keep].to(cache.k_window.dtype)
    cache.v_window[window_slot, rows] = v[keep].to(cache.v_window.dtype)


# ------------------------------------------------------------------- prefix caching
def reusable_prefix_len(prefix_len: int, *, sink_size: int, recent_size: int, page_size: int,
                        have_sinks: bool) -> int:
    """How much of a radix-cache hit of ``prefix_len`` tokens a new request may reuse.

    The new request's window slot must hold BF16 rows of its sinks ``[0, S)`` and of the
    ``W`` positions before its first new query. The sinks come from the sink store (keyed
    by the first ``S`` token ids); the recent rows are recomputed: the reused prefix is cut
    to ``P' = floor((P - W) / page_size) * page_size`` so SGLang recomputes
    ``[P', P)`` from real K/V. Without stored sinks, or when ``P <= S + W``, nothing is
    reused (``0``): the request recomputes its prompt, which is always exact.

    Example
    -------
    >>> reusable_prefix_len(1000, sink_size=64, recent_size=256, page_size=16, have_sinks=True)
    736
    """
    if prefix_len <= sink_size + recent_size or not have_sinks:
        return 0
    return (prefix_len - recent_size) // page_size * page_size


def sink_key(token_ids, sink_size: int, extra=None) -> str | None:
    """Key of the sink store: the first ``sink_size`` token ids (plus SGLang's
    ``extra_key``/LoRA id, which change K/V for the same tokens); ``None`` when shorter."""
    if sink_size <= 0 or len(token_ids) < sink_size:
        return None
    import hashlib

    h = hashlib.sha1(repr((tuple(int(t) for t in token_ids[:sink_size]), extra)).encode())
    return h.hexdigest()


# ------------------------------------------------------------------- memory planning
def _check_dims(**dims) -> None:
    for name, val in dims.items():
        expect(isinstance(val, int) and val >= 1, name, "a positive int", val)


def _spec(num_kv_heads: int, head_dim: int, config: OscarConfig):
    from ..spec import CacheSpec

    return CacheSpec(num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=1,
                     group_size=config.group_size, sink_size=config.sink_size,
                     recent_size=config.recent_size)


def int2_cell_size(*, num_kv_heads: int, head_dim: int, num_layers: int,
                   config: OscarConfig) -> int:
    """Average bytes per token of KV capacity when requests average
    ``config.tokens_per_request`` tokens: INT2 pages plus one BF16 window slot of
    ``sink_size + recent_size`` rows per request row, spread over its tokens.

    A rule of thumb for sizing; the plan itself (:func:`int2_memory_plan`) counts the
    window slots the pool allocates, not an average.

    Example
    -------
    >>> int2_cell_size(num_kv_heads=8, head_dim=128, num_layers=36, config=OscarConfig())
    43776
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    spec = _spec(num_kv_heads, head_dim, config)
    window_row = spec.window_size * spec.bf16_bytes_per_token
    per_token = spec.int2_bytes_per_token + -(-window_row // config.tokens_per_request)
    return per_token * num_layers


def int2_token_bytes(*, num_kv_heads: int, head_dim: int, num_layers: int,
                     config: OscarConfig) -> int:
    """INT2 page bytes of one token of KV capacity, all layers (SGLang's cell size under
    ``int2``): codes and scale/zero parameters of K and V.

    Example
    -------
    >>> int2_token_bytes(num_kv_heads=8, head_dim=128, num_layers=36, config=OscarConfig())
    20736
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    return _spec(num_kv_heads, head_dim, config).int2_bytes_per_token * num_layers


def int2_window_slot_bytes(*, num_kv_heads: int, head_dim: int, num_layers: int,
                           config: OscarConfig) -> int:
    """Bytes of one BF16 window slot, all layers: ``sink_size + recent_size`` K and V rows.

    Example
    -------
    >>> int2_window_slot_bytes(num_kv_heads=8, head_dim=128, num_layers=36,
    ...                        config=OscarConfig())
    47185920
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    spec = _spec(num_kv_heads, head_dim, config)
    return spec.window_size * spec.bf16_bytes_per_token * num_layers


def int2_pool_pages(max_total_num_tokens: int, page_size: int) -> int:
    """Pages :class:`~oscar_kernels.integrations.sglang_backend.OscarInt2TokenToKVPool`
    allocates for SGLang's ``max_total_num_tokens`` token slots (slot ``s`` is page
    ``s // page_size``; SGLang's slots run to ``max_total_num_tokens + page_size``).

    Example
    -------
    >>> int2_pool_pages(1000, 16)
    64
    """
    expect(isinstance(max_total_num_tokens, int) and max_total_num_tokens >= 0,
           "max_total_num_tokens", "an int >= 0", max_total_num_tokens)
    expect(isinstance(page_size, int) and page_size >= 1, "page_size", "a positive int",
           page_size)
    return (max_total_num_tokens + page_size) // page_size + 1


def int2_graph_max_bs(max_running_requests: int, *, capture_bs, bs_alignment: int = 1) -> int:
    """Largest decode batch SGLang 0.5.23 captures a CUDA graph for (0: none captured).

    ``get_batch_sizes_to_capture`` (decode runner) takes the ``--cuda-graph-bs-decode``
    list (``cuda_graph_config.decode.bs``), adds ``ceil(max_running_requests /
    bs_alignment) * bs_alignment`` when the list goes beyond it, and keeps the sizes that
    are multiples of ``bs_alignment`` and not beyond that bound. ``init_cuda_graph_state``
    is called with the largest.

    Parameters
    ----------
    max_running_requests : int
        ``ReqToTokenPool.size`` (request rows, without the padding row 0).
    capture_bs : sequence of int
        The decode capture list; empty when decode graphs are off.
    bs_alignment : int
        ``get_cuda_graph_batch_size_alignment`` (1 without TBO / gathered buffers).

    Example
    -------
    >>> int2_graph_max_bs(116, capture_bs=[1, 2, 4, 8, 12, 16, 24, 256])
    116
    >>> int2_graph_max_bs(1194, capture_bs=[1, 2, 4, 8, 12, 16, 24, 256])
    256
    """
    expect(isinstance(max_running_requests, int) and max_running_requests >= 1,
           "max_running_requests", "a positive int", max_running_requests)
    expect(isinstance(bs_alignment, int) and bs_alignment >= 1, "bs_alignment",
           "a positive int", bs_alignment)
    bs = [int(b) for b in capture_bs or ()]
    if not bs:
        return 0
    limit = -(-max_running_requests // bs_alignment) * bs_alignment
    if max(bs) > limit:
        bs.append(limit)
    bs = [b for b in bs if b % bs_alignment == 0 and 0 < b <= limit]
    return max(bs) if bs else 0


def int2_window_slots(max_running_requests: int, *, graph_max_bs: int) -> int:
    """Window slots the pool allocates: one per SGLang request row (``max_running_requests``
    rows plus the padding row 0) and ``graph_max_bs - 1`` spares.

    A CUDA-graph batch padded to ``bs`` entries repeats the padding row 0 (at capture:
    ``bs`` times); each entry needs its own slot (the ops take distinct slots), so the
    repeats take spare slots after the request rows: at most ``graph_max_bs - 1``.

    Example
    -------
    >>> int2_window_slots(100, graph_max_bs=32)
    132
    >>> int2_window_slots(100, graph_max_bs=0)
    101
    """
    expect(isinstance(max_running_requests, int) and max_running_requests >= 1,
           "max_running_requests", "a positive int", max_running_requests)
    expect(isinstance(graph_max_bs, int) and graph_max_bs >= 0, "graph_max_bs",
           "an int >= 0", graph_max_bs)
    return max_running_requests + 1 + max(graph_max_bs - 1, 0)


@dataclass(frozen=True)
class Int2MemoryPlan:
    """What the INT2 pool allocates for a token capacity (bytes, all local layers)."""

    max_total_num_tokens: int
    page_size: int
    num_pages: int
    max_running_requests: int
    graph_max_bs: int
    window_slots: int
    page_bytes: int
    window_bytes: int
    sink_store_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.page_bytes + self.window_bytes + self.sink_store_bytes


def int2_memory_cost(max_total_num_tokens: int, *, page_size: int, token_bytes: int,
                     window_slot_bytes: int, sink_store_bytes: int, max_running_requests,
                     graph_max_bs) -> Int2MemoryPlan:
    """The bytes the INT2 pool allocates for ``max_total_num_tokens`` token slots.

    Parameters
    ----------
    max_total_num_tokens, page_size : int
    token_bytes : int
        :func:`int2_token_bytes`.
    window_slot_bytes : int
        :func:`int2_window_slot_bytes`.
    sink_store_bytes : int
        :func:`int2_sink_store_bytes`.
    max_running_requests : callable ``int -> int``
        Request rows SGLang gives this capacity (``resolve_max_num_reqs`` with the INT2
        cap); non-decreasing.
    graph_max_bs : callable ``int -> int``
        Largest captured decode batch for that many request rows (:func:`int2_graph_max_bs`;
        0 without decode graphs); non-decreasing.

    Returns
    -------
    Int2MemoryPlan
        ``page_bytes = int2_pool_pages(...) * page_size * token_bytes``, ``window_bytes =
        int2_window_slots(...) * window_slot_bytes``, the sink store.
    """
    rows = max(1, int(max_running_requests(max_total_num_tokens)))
    gbs = int(graph_max_bs(rows))
    pages = int2_pool_pages(max_total_num_tokens, page_size)
    slots = int2_window_slots(rows, graph_max_bs=gbs)
    return Int2MemoryPlan(max_total_num_tokens=max_total_num_tokens, page_size=page_size,
                          num_pages=pages, max_running_requests=rows, graph_max_bs=gbs,
                          window_slots=slots, page_bytes=pages * page_size * token_bytes,
                          window_bytes=slots * window_slot_bytes,
                          sink_store_bytes=sink_store_bytes)


def int2_memory_plan(available_bytes: int, *, page_size: int, token_bytes: int,
                     window_slot_bytes: int, sink_store_bytes: int, max_running_requests,
                     graph_max_bs, config: OscarConfig) -> Int2MemoryPlan:
    """The largest token capacity (whole pages) whose INT2 pool fits SGLang's KV budget.

    Everything the pool and the attention backend allocate is counted once
    (:func:`int2_memory_cost`): INT2 pages, one BF16 window slot per request row (the rows
    SGLang derives from the capacity, plus its padding row 0), the spare slots of
    CUDA-graph padding (the largest captured decode batch, which SGLang also derives from
    the request rows), and the BF16 sink store. The cost grows with the capacity, so the
    largest capacity that fits is found by bisection over pages.

    Parameters
    ----------
    available_bytes : int
        SGLang's KV budget (``_profile_available_bytes``).
    page_size, token_bytes, window_slot_bytes, sink_store_bytes, max_running_requests,
    graph_max_bs
        As :func:`int2_memory_cost`.
    config : OscarConfig
        Named in the error message.

    Returns
    -------
    Int2MemoryPlan
        ``total_bytes <= available_bytes``; one more page would not fit.

    Raises
    ------
    ValueError
        Not even one page of tokens fits; the message names the flags and byte counts.

    Example
    -------
    >>> plan = int2_memory_plan(10 << 30, page_size=1, token_bytes=20736,
    ...                         window_slot_bytes=47185920, sink_store_bytes=301989888,
    ...                         max_running_requests=lambda t: t // 2048,
    ...                         graph_max_bs=lambda r: 0, config=OscarConfig())
    >>> plan.max_total_num_tokens, plan.window_slots
    (237567, 116)
    """
    for name, val, low in (("available_bytes", available_bytes, 0), ("page_size", page_size, 1),
                           ("token_bytes", token_bytes, 1),
                           ("window_slot_bytes", window_slot_bytes, 0),
                           ("sink_store_bytes", sink_store_bytes, 0)):
        expect(isinstance(val, int) and val >= low, name, f"an int >= {low}", val)

    def cost(pages: int) -> Int2MemoryPlan:
        return int2_memory_cost(pages * page_size, page_size=page_size,
                                token_bytes=token_bytes, window_slot_bytes=window_slot_bytes,
                                sink_store_bytes=sink_store_bytes,
                                max_running_requests=max_running_requests,
                                graph_max_bs=graph_max_bs)

    one = cost(1)
    if one.total_bytes > available_bytes:
        raise ValueError(
            f"--kv-cache-dtype int2: expected SGLang's KV budget to hold one page of tokens "
            f"({one.page_bytes:,} B of INT2 pages), {one.window_slots} BF16 window slots "
            f"({one.window_bytes:,} B: --oscar-sink-size {config.sink_size} + "
            f"--oscar-recent-size {config.recent_size} rows each; "
            f"{max(one.graph_max_bs - 1, 0)} of them spares for decode CUDA graphs up to "
            f"batch {one.graph_max_bs}, --cuda-graph-max-bs-decode) and the sink store "
            f"({one.sink_store_bytes:,} B, --oscar-sink-cache-entries {config.sink_entries}), "
            f"{one.total_bytes:,} B in all; got a budget of {available_bytes:,} B. Lower "
            "those flags or raise --mem-fraction-static")
    lo, hi = 1, max(1, available_bytes // (page_size * token_bytes))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid).total_bytes <= available_bytes:
            lo = mid
        else:
            hi = mid - 1
    return cost(lo)


def int2_sink_store_bytes(*, num_kv_heads: int, head_dim: int, num_layers: int,
                          config: OscarConfig) -> int:
    """Bytes of the pool's BF16 sink store: ``sink_entries x sink_size`` K+V rows per layer.

    The store keeps the BF16 sink rows of recently seen prompt prefixes so that a request
    reusing a radix-cache prefix gets exact sinks (docs/integrations.md section 2.2). It is
    allocated once, with the pool; ``sink_entries == 0`` or ``sink_size == 0`` gives 0.

    Parameters
    ----------
    num_kv_heads : int
        KV heads on this rank.
    head_dim : int
    num_layers : int
        Layers of this pool (SGLang's effective layers).
    config : OscarConfig
        ``sink_entries`` and ``sink_size`` are read.

    Returns
    -------
    int
        ``sink_entries * sink_size * (2 * num_kv_heads * head_dim * 2) * num_layers``.

    Example
    -------
    >>> int2_sink_store_bytes(num_kv_heads=8, head_dim=128, num_layers=36,
    ...                       config=OscarConfig())
    301989888
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    spec = _spec(num_kv_heads, head_dim, config)
    return config.sink_entries * config.sink_size * spec.bf16_bytes_per_token * num_layers


def int2_max_running_requests(token_capacity: int, sglang_choice: int,
                              config: OscarConfig) -> int:
    """Request rows the INT2 memory plan covers: ``token_capacity / tokens_per_request``,
    never more than SGLang's own choice."""
    return max(1, min(sglang_choice, token_capacity // config.tokens_per_request))


# --------------------------------------------------------------------------- hooks
_PARSER_FLAGS = (
    ("--oscar-rotation-path", dict(type=str, default=None,
                                   help="INT2 KV cache: rotation artifact (.safetensors file, "
                                        "or a directory with one, or a RotationZoo "
                                        "k_rotation_*.pt / v_rotation_*.pt pair)")),
    ("--oscar-sink-size", dict(type=int, default=DEFAULT_SINK_SIZE,
                               help="INT2 KV cache: first tokens kept in BF16")),
    ("--oscar-recent-size", dict(type=int, default=DEFAULT_RECENT_SIZE,
                                 help="INT2 KV cache: last tokens kept in BF16")),
    ("--oscar-group-size", dict(type=int, default=None,
                                help="INT2 KV cache: channels per scale/zero (default head_dim)")),
    ("--oscar-sink-cache-entries", dict(type=int, default=DEFAULT_SINK_ENTRIES,
                                        help="INT2 KV cache: BF16 sink rows kept per distinct "
                                             "first-sink_size-token prefix, for prefix-cache "
                                             "hits (LRU); taken out of the KV memory budget; "
                                             "0 turns the store off (a prefix hit then "
                                             "recomputes the prompt)")),
    ("--oscar-tokens-per-request", dict(type=int, default=DEFAULT_TOKENS_PER_REQUEST,
                                        help="INT2 KV cache: memory planning; each running "
                                             "request also holds a BF16 window slot, planned "
                                             "inside the KV budget; max running requests are "
                                             "capped at tokens / this")),
    ("--oscar-backend", dict(type=str, default="auto",
                             choices=["auto", "reference", "triton", "cute"],
                             help="INT2 KV cache: kernel backend")),
)


def _after_add_cli_args(result, parser, *args, **kwargs):
    for action in parser._actions:
        if action.dest == "kv_cache_dtype" and action.choices is not None \
                and INT2 not in action.choices:
            action.choices = list(action.choices) + [INT2]
            action.help = (action.help or "") + ' "int2": OSCAR INT2 KV cache (oscar-kernels).'
    existing = {o for a in parser._actions for o in a.option_strings}
    for flag, kw in _PARSER_FLAGS:
        if flag not in existing:
            parser.add_argument(flag, **kw)
    return result


def _around_from_cli_args(original, cls, args, *rest, **kwargs):
    if getattr(args, "kv_cache_dtype", None) == INT2:
        OscarConfig(rotation_path=getattr(args, "oscar_rotation_path", None),
                    sink_size=getattr(args, "oscar_sink_size", DEFAULT_SINK_SIZE),
                    recent_size=getattr(args, "oscar_recent_size", DEFAULT_RECENT_SIZE),
                    group_size=getattr(args, "oscar_group_size", None),
                    backend=getattr(args, "oscar_backend", "auto"),
                    sink_entries=getattr(args, "oscar_sink_cache_entries",
                                         DEFAULT_SINK_ENTRIES),
                    tokens_per_request=getattr(args, "oscar_tokens_per_request",
                                               DEFAULT_TOKENS_PER_REQUEST)).to_env()
    return original(cls, args, *rest, **kwargs)


def _before_resolve_once(self, *args, **kwargs):
    if getattr(self, "kv_cache_dtype", None) != INT2:
        return None
    if not int2_enabled():  # Engine(kv_cache_dtype="int2") without the CLI: env or defaults
        OscarConfig.from_env().to_env()
    config = OscarConfig.from_env()
    config.validate()
    check_server_args(self)
    # SGLang's own checks see the model dtype; the INT2 pool replaces the BF16 one later.
    self.kv_cache_dtype = "auto"
    log.info("oscar int2: INT2 KV cache enabled (%s)", config)
    return None


def _around_build_mha_kv_pool(original, self, *args, **kwargs):
    if not int2_enabled():
        return original(self, *args, **kwargs)
    from .sglang_backend import build_int2_pool

    return build_int2_pool(self, *args, **kwargs)


def _around_build_attention_backend(original, *args, **kwargs):
    if not int2_enabled():
        return original(*args, **kwargs)
    from .sglang_backend import OscarInt2AttnBackend

    model_runner = kwargs.get("model_runner", args[0] if args else None)
    log.info("oscar int2: attention backend OscarInt2AttnBackend (requested %r replaced)",
             kwargs.get("backend_str"))
    return OscarInt2AttnBackend(model_runner)


def _decode_graph_capture_bs(device) -> list[int]:
    """SGLang's decode CUDA-graph capture list, or ``[]`` when no decode graph calls
    ``init_cuda_graph_state`` (``capture_decode_graph``: off on CPU, or with the decode
    backend ``disabled``: ``--disable-cuda-graph``, ``--cuda-graph-backend-decode disabled``)."""
    if str(device).startswith("cpu"):
        return []
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec

    dec = get_exec().graph.cuda_graph_config.decode
    if dec.backend == Backend.DISABLED or not dec.bs:
        return []
    return [int(b) for b in dec.bs]


def _graph_max_bs_fn(device):
    """``rows -> largest captured decode batch`` for this process (0 without graphs), the
    larger of SGLang's two batch-size alignments (with and without gathered buffers)."""
    capture_bs = _decode_graph_capture_bs(device)
    if not capture_bs:
        return lambda rows: 0
    from sglang.srt.utils.common import get_cuda_graph_batch_size_alignment

    aligns = {int(get_cuda_graph_batch_size_alignment(gathered_buffer_required=g))
              for g in (False, True)}
    return lambda rows: max(int2_graph_max_bs(int(rows), capture_bs=capture_bs,
                                              bs_alignment=a) for a in aligns)


#: ``max_running_requests`` of the pools being built (``_build_token_to_kv_pool`` hook).
_PLANNED_ROWS: list[int] = []


def planned_window_slots(device) -> int:
    """Window slots the INT2 pool being built allocates: SGLang's request rows (recorded
    by the ``_build_token_to_kv_pool`` hook), the padding row and the graph spares, as
    :func:`int2_memory_plan` counted them."""
    if not _PLANNED_ROWS:
        raise UnsupportedConfigError("--kv-cache-dtype int2: the INT2 pool was requested "
                                     "outside KVCacheConfigurator._build_token_to_kv_pool "
                                     "(its window slots are planned from SGLang's "
                                     "max_running_requests)")
    rows = _PLANNED_ROWS[-1]
    return int2_window_slots(rows, graph_max_bs=int(_graph_max_bs_fn(device)(rows)))


class _QuietLogger:
    """Silences one logger (SGLang's 'max_running_requests was reduced' warning while the
    plan tries capacities)."""

    def __init__(self, name: str):
        self.logger = logging.getLogger(name)

    def __enter__(self):
        self.was, self.logger.disabled = self.logger.disabled, True

    def __exit__(self, *exc):
        self.logger.disabled = self.was


def _around_compute_cell_size(original, self, kvc, num_layers, *args, **kwargs):
    if not int2_enabled():
        return original(self, kvc, num_layers, *args, **kwargs)
    from sglang.srt.runtime_context import get_parallel

    mc = kvc.model_config
    config = OscarConfig.from_env()
    dims = dict(num_kv_heads=mc.get_num_kv_heads(get_parallel().attn_tp_size),
                head_dim=mc.head_dim, num_layers=int(num_layers), config=config)
    cell = int2_token_bytes(**dims)
    log.info("oscar int2: %d bytes of INT2 pages per token (BF16 windows, graph spares and "
             "the sink store are planned per request / once)", cell)
    if self is not None:  # read by _around_calculate_pool_sizes on this configurator
        self._oscar_kvc = kvc
        self._oscar_window_slot_bytes = int2_window_slot_bytes(**dims)
        self._oscar_sink_store_bytes = int2_sink_store_bytes(**dims)
    return cell


def _around_calculate_pool_sizes(original, self, available_bytes, page_size, *args, **kwargs):
    """Size the INT2 pool so that pages, window slots (request rows, padding row, graph
    spares) and the sink store fit the KV budget (:func:`int2_memory_plan`)."""
    kvc = getattr(self, "_oscar_kvc", None)
    if not int2_enabled() or kvc is None:
        return original(self, available_bytes, page_size, *args, **kwargs)
    config = OscarConfig.from_env()
    overhead = int(getattr(self, "_fixed_overhead_bytes", 0) or 0)
    resolve = type(kvc).resolve_max_num_reqs
    resolve = getattr(resolve, "__wrapped__", resolve)  # SGLang's own, without the cap hook

    def rows(tokens: int) -> int:
        return int2_max_running_requests(tokens, int(resolve(kvc, tokens)), config)

    with _QuietLogger(type(kvc).__module__):
        plan = int2_memory_plan(max(int(available_bytes) - overhead, 0),
                                page_size=int(page_size), token_bytes=int(self._cell_size),
                                window_slot_bytes=self._oscar_window_slot_bytes,
                                sink_store_bytes=self._oscar_sink_store_bytes,
                                max_running_requests=rows,
                                graph_max_bs=_graph_max_bs_fn(kvc.device), config=config)
    log.info("oscar int2: KV budget %d B fits %d tokens (%d B of INT2 pages), %d request rows, "
             "%d BF16 window slots (%d B, %d spares for decode graphs up to batch %d), sink "
             "store %d B (before SGLang's --max-total-tokens / --max-running-requests caps, "
             "if given; the pool is logged when built)", available_bytes, plan.max_total_num_tokens, plan.page_bytes,
             plan.max_running_requests, plan.window_slots, plan.window_bytes,
             max(plan.graph_max_bs - 1, 0), plan.graph_max_bs, plan.sink_store_bytes)
    # SGLang divides the budget by the cell size: hand it exactly the planned tokens' pages
    return original(self, plan.max_total_num_tokens * self._cell_size + overhead, page_size,
                    *args, **kwargs)


def _after_resolve_max_num_reqs(result, self, token_capacity, *args, **kwargs):
    if not int2_enabled():
        return result
    capped = int2_max_running_requests(int(token_capacity), int(result), OscarConfig.from_env())
    if capped < result:
        log.info("oscar int2: max running requests %d -> %d (one BF16 window slot each; "
                 "--oscar-tokens-per-request)", result, capped)
    return capped


def _around_build_token_to_kv_pool(original, self, *args, **kwargs):
    """Record the planned request rows while SGLang builds the KV pool (the INT2 pool
    allocates its window slots for them: :func:`planned_window_slots`)."""
    sizes = kwargs.get("sizes", args[0] if args else None)
    if not int2_enabled() or sizes is None:
        return original(self, *args, **kwargs)
    _PLANNED_ROWS.append(int(sizes.max_running_requests))
    try:
        return original(self, *args, **kwargs)
    finally:
        _PLANNED_ROWS.pop()


def _after_alloc_rows(result, pool, *args, **kwargs):
    if result is not None and int2_enabled():
        from .sglang_backend import mark_fresh_rows

        mark_fresh_rows(result)
    return result


def _req_sink_key(req, sink_size: int):
    extra = (getattr(req, "extra_key", None), getattr(req, "lora_id", None))
    return sink_key(list(req.origin_input_ids[:sink_size]), sink_size, extra)


def _after_alloc(result, pool, reqs, *args, **kwargs):
    """Remember each request row's sink key (the backend stores/restores sinks by it)."""
    if result is not None and int2_enabled():
        from .sglang_backend import set_row_sink_key

        s = OscarConfig.from_env().sink_size
        for req, row in zip(reqs, result):
            set_row_sink_key(int(row), _req_sink_key(req, s))
    return result


def _around_match_kv_cache(original, req, tree_cache, token_ids=None, *args, **kwargs):
    """Cut a new request's prefix hit so its window is recomputed (reusable_prefix_len)."""
    result = original(req, tree_cache, token_ids, *args, **kwargs)
    if not int2_enabled() or getattr(getattr(req, "kv", None), "holds_kv", False):
        return result  # a running request (chunked prefill) keeps its own valid window
    p = int(getattr(req, "prefix_len", 0) or 0)
    if p <= 0:
        return result
    from .sglang_backend import has_sink_entry, page_size_of_active_pool

    cfg = OscarConfig.from_env()
    keep = reusable_prefix_len(p, sink_size=cfg.sink_size, recent_size=cfg.recent_size,
                               page_size=page_size_of_active_pool(),
                               have_sinks=cfg.sink_size == 0
                               or has_sink_entry(_req_sink_key(req, cfg.sink_size)))
    if keep < p:
        kwargs["max_prefix_len"] = keep
        result = original(req, tree_cache, token_ids, *args, **kwargs)
    return result


HOOKS = (
    ("sglang.srt.server_args.ServerArgs.add_cli_args", _after_add_cli_args, "AFTER"),
    ("sglang.srt.server_args.ServerArgs.from_cli_args", _around_from_cli_args, "AROUND"),
    ("sglang.srt.server_args.ServerArgs.resolve_once", _before_resolve_once, "BEFORE"),
    ("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._build_mha_kv_pool",
     _around_build_mha_kv_pool, "AROUND"),
    ("sglang.srt.model_executor.model_runner_components.attention_backend_setup."
     "_build_full_attention_backend_from_str", _around_build_attention_backend, "AROUND"),
    ("sglang.srt.mem_cache.memory_pool.ReqToTokenPool.alloc_rows", _after_alloc_rows, "AFTER"),
    ("sglang.srt.mem_cache.memory_pool.ReqToTokenPool.alloc", _after_alloc, "AFTER"),
    ("sglang.srt.mem_cache.common.match_kv_cache", _around_match_kv_cache, "AROUND"),
    ("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size",
     _around_compute_cell_size, "AROUND"),
    ("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator.calculate_pool_sizes",
     _around_calculate_pool_sizes, "AROUND"),
    ("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.resolve_max_num_reqs",
     _after_resolve_max_num_reqs, "AFTER"),
    ("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._build_token_to_kv_pool",
     _around_build_token_to_kv_pool, "AROUND"),
)


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group: register the hooks above."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in HOOKS:
        HookRegistry.register(target, fn, getattr(HookType, kind))
    log.info("oscar int2: SGLang plugin registered %d hooks", len(HOOKS))
