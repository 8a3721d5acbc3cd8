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
* ``DefaultPoolConfigurator._compute_cell_size`` (around) and
  ``KVCacheConfigurator.resolve_max_num_reqs`` (after): SGLang budgets KV memory for INT2
  pages plus one BF16 window slot per running request (:func:`int2_cell_size`).
* ``DefaultPoolConfigurator.calculate_pool_sizes`` (around): the BF16 sink store
  (:func:`int2_sink_store_bytes`) is taken out of the KV byte budget before SGLang turns
  it into a token capacity (:func:`int2_kv_budget`).

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
def int2_cell_size(*, num_kv_heads: int, head_dim: int, num_layers: int,
                   config: OscarConfig) -> int:
    """Bytes SGLang should budget per token of KV capacity under ``int2``.

    The INT2 pages cost ``spec.int2_bytes_per_token`` per token and layer; every running
    request also holds a BF16 window slot of ``sink_size + recent_size`` rows per layer,
    charged here per token as if requests averaged ``config.tokens_per_request`` tokens
    (:func:`int2_max_running_requests` then caps the request rows to match).

    Example
    -------
    >>> int2_cell_size(num_kv_heads=8, head_dim=128, num_layers=36, config=OscarConfig())
    43776
    """
    from ..spec import CacheSpec

    spec = CacheSpec(num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=1,
                     group_size=config.group_size, sink_size=config.sink_size,
                     recent_size=config.recent_size)
    window_row = spec.window_size * spec.bf16_bytes_per_token
    per_token = spec.int2_bytes_per_token + -(-window_row // config.tokens_per_request)
    return per_token * num_layers


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
    for name, val in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                      ("num_layers", num_layers)):
        expect(isinstance(val, int) and val >= 1, name, "a positive int", val)
    bf16_row = 2 * num_kv_heads * head_dim * 2  # K and V, 2 bytes each
    return config.sink_entries * config.sink_size * bf16_row * num_layers


def int2_kv_budget(available_bytes: int, *, sink_store_bytes: int, cell_size: int,
                   page_size: int, config: OscarConfig) -> int:
    """KV bytes left for token capacity once the BF16 sink store is taken out.

    SGLang's ``DefaultPoolConfigurator.calculate_pool_sizes`` turns a KV byte budget into
    ``budget // cell_size`` tokens, rounded down to whole pages. Under ``int2`` it is given
    ``available_bytes - sink_store_bytes`` instead, so the sink store, allocated with the
    pool, is inside the budget exactly once and the planned capacity is
    ``(available_bytes - sink_store_bytes) // cell_size // page_size * page_size``.

    Parameters
    ----------
    available_bytes : int
        SGLang's KV budget (``_profile_available_bytes``: free memory after the weights
        minus the ``--mem-fraction-static`` headroom).
    sink_store_bytes : int
        :func:`int2_sink_store_bytes` of this rank's pool.
    cell_size : int
        SGLang's per-token cost (:func:`int2_cell_size` under ``int2``).
    page_size : int
        SGLang's ``--page-size``.
    config : OscarConfig
        Named in the error message.

    Returns
    -------
    int
        ``available_bytes - sink_store_bytes``; ``available_bytes`` when the store is empty.

    Raises
    ------
    ValueError
        The budget cannot hold the sink store plus one page of tokens; the message names
        ``--oscar-sink-cache-entries`` and the byte counts.

    Example
    -------
    >>> int2_kv_budget(10 << 30, sink_store_bytes=301989888, cell_size=43776, page_size=1,
    ...                config=OscarConfig())
    10435428352
    """
    for name, val, low in (("available_bytes", available_bytes, 0),
                           ("sink_store_bytes", sink_store_bytes, 0),
                           ("cell_size", cell_size, 1), ("page_size", page_size, 1)):
        expect(isinstance(val, int) and val >= low, name, f"an int >= {low}", val)
    if sink_store_bytes == 0:
        return available_bytes
    need = sink_store_bytes + cell_size * page_size
    if available_bytes < need:
        raise ValueError(
            f"--oscar-sink-cache-entries {config.sink_entries}: expected SGLang's KV budget "
            f"to hold the BF16 sink store ({config.sink_entries} entries x "
            f"{config.sink_size} sink rows = {sink_store_bytes:,} B) plus one page of tokens "
            f"({cell_size * page_size:,} B), {need:,} B in all; got a budget of "
            f"{available_bytes:,} B. Lower --oscar-sink-cache-entries (0 turns the sink "
            "store off) or raise --mem-fraction-static")
    return available_bytes - sink_store_bytes


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
                                             "request also holds a BF16 window slot, budgeted "
                                             "as if requests averaged this many tokens "
                                             "(max running requests = tokens / this)")),
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


def _around_compute_cell_size(original, self, kvc, num_layers, *args, **kwargs):
    if not int2_enabled():
        return original(self, kvc, num_layers, *args, **kwargs)
    from sglang.srt.runtime_context import get_parallel

    mc = kvc.model_config
    config = OscarConfig.from_env()
    dims = dict(num_kv_heads=mc.get_num_kv_heads(get_parallel().attn_tp_size),
                head_dim=mc.head_dim, num_layers=int(num_layers), config=config)
    cell = int2_cell_size(**dims)
    log.info("oscar int2: %d bytes of KV budget per token (INT2 pages + BF16 windows)", cell)
    if self is not None:  # read by _around_calculate_pool_sizes on this configurator
        self._oscar_sink_store_bytes = int2_sink_store_bytes(**dims)
    return cell


def _around_calculate_pool_sizes(original, self, available_bytes, page_size, *args, **kwargs):
    """Take the BF16 sink store out of the KV budget before SGLang sizes the pool."""
    sink = getattr(self, "_oscar_sink_store_bytes", 0)
    if not int2_enabled() or not sink:
        return original(self, available_bytes, page_size, *args, **kwargs)
    budget = int2_kv_budget(int(available_bytes), sink_store_bytes=sink,
                            cell_size=int(self._cell_size), page_size=int(page_size),
                            config=OscarConfig.from_env())
    log.info("oscar int2: %d of %d bytes of KV budget go to the BF16 sink store "
             "(--oscar-sink-cache-entries); %d left for tokens", sink, available_bytes, budget)
    return original(self, budget, page_size, *args, **kwargs)


def _after_resolve_max_num_reqs(result, self, token_capacity, *args, **kwargs):
    if not int2_enabled():
        return result
    capped = int2_max_running_requests(int(token_capacity), int(result), OscarConfig.from_env())
    if capped < result:
        log.info("oscar int2: max running requests %d -> %d (one BF16 window slot each; "
                 "--oscar-tokens-per-request)", result, capped)
    return capped


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
)


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group: register the hooks above."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in HOOKS:
        HookRegistry.register(target, fn, getattr(HookType, kind))
    log.info("oscar int2: SGLang plugin registered %d hooks", len(HOOKS))
