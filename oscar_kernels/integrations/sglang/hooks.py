"""The plugin's hooks into SGLang's functions, and the table :func:`register` installs.

Each hook is a plain function with the signature of SGLang's ``HookRegistry`` (``BEFORE``:
the call's arguments; ``AFTER``: the result first; ``AROUND``: the original first). Every
hook is a no-op unless this process serves with the INT2 cache (:func:`int2_enabled`), so a
process that loaded the plugin but runs another ``--kv-cache-dtype`` is unchanged.

* ``ServerArgs.add_cli_args`` (after): adds ``int2`` to ``--kv-cache-dtype`` and the
  ``--oscar-*`` flags (:data:`~.config.PARSER_FLAGS`).
* ``ServerArgs.from_cli_args`` (around): moves the ``--oscar-*`` values into ``OSCAR_*``
  environment variables (inherited by SGLang's worker processes).
* ``ServerArgs.resolve_once`` (before): turns ``kv_cache_dtype="int2"`` into the model
  dtype for SGLang's own checks, records ``OSCAR_KV_CACHE_DTYPE=int2`` and rejects
  unsupported combinations (:func:`~.checks.check_server_args`) at startup.
* ``KVCacheConfigurator._build_mha_kv_pool`` (around): builds the INT2 pool
  (:func:`~.pool.build_int2_pool`).
* ``attention_backend_setup._build_full_attention_backend_from_str`` (around): returns
  :class:`~.backend.OscarInt2AttnBackend`.
* ``ReqToTokenPool.alloc_rows`` / ``alloc`` (after): marks freshly assigned request rows,
  whose window slots must be rebuilt, and records each row's sink key.
* ``mem_cache.common.match_kv_cache`` (around): cuts a new request's radix-cache hit so
  the window positions are recomputed (:func:`~.prefix.reusable_prefix_len`).
* ``DefaultPoolConfigurator._compute_cell_size`` (around),
  ``DefaultPoolConfigurator.calculate_pool_sizes`` (around) and
  ``KVCacheConfigurator.resolve_max_num_reqs`` (after): the token capacity is the largest
  whose INT2 pages, BF16 window slots and BF16 sink store fit SGLang's KV budget
  (:func:`~.memory_plan.int2_memory_plan`); request rows are capped at
  ``tokens / --oscar-tokens-per-request``.
* ``KVCacheConfigurator._build_token_to_kv_pool`` (around): records SGLang's request rows
  so that the INT2 pool allocates the planned window slots.

What the hooks record lives in :data:`STATE`, this process's
:class:`~.state.PluginState`; the pool is built with it and the backend reads it from the
pool. The pool and backend modules import SGLang, so they are imported when a hook first
needs them.
"""

from __future__ import annotations

import logging

from .checks import check_server_args
from .config import INT2, PARSER_FLAGS, OscarConfig, int2_enabled
from .cuda_graphs import graph_max_bs_fn
from .memory_plan import (int2_max_running_requests, int2_memory_plan, int2_sink_store_bytes,
                          int2_token_bytes, int2_window_slot_bytes)
from .prefix import reusable_prefix_len, sink_key
from .state import PluginState

log = logging.getLogger(__name__)

#: What this process's hooks record (request rows, sink keys, the INT2 pool).
STATE = PluginState()


# ------------------------------------------------------------------ server arguments
def _after_add_cli_args(result, parser, *args, **kwargs):
    for action in parser._actions:
        if action.dest == "kv_cache_dtype" and action.choices is not None \
                and INT2 not in action.choices:
            action.choices = list(action.choices) + [INT2]
            action.help = (action.help or "") + ' "int2": OSCAR INT2 KV cache (oscar-kernels).'
    existing = {o for a in parser._actions for o in a.option_strings}
    for flag, kw in PARSER_FLAGS:
        if flag not in existing:
            parser.add_argument(flag, **kw)
    return result


def _around_from_cli_args(original, cls, args, *rest, **kwargs):
    if getattr(args, "kv_cache_dtype", None) == INT2:
        OscarConfig.from_args(args).to_env()
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


# -------------------------------------------------------------- pool and backend
def _around_build_mha_kv_pool(original, self, *args, **kwargs):
    if not int2_enabled():
        return original(self, *args, **kwargs)
    from .pool import build_int2_pool

    return build_int2_pool(self, STATE, *args, **kwargs)


def _around_build_attention_backend(original, *args, **kwargs):
    if not int2_enabled():
        return original(*args, **kwargs)
    from .backend import OscarInt2AttnBackend

    model_runner = kwargs.get("model_runner", args[0] if args else None)
    log.info("oscar int2: attention backend OscarInt2AttnBackend (requested %r replaced)",
             kwargs.get("backend_str"))
    return OscarInt2AttnBackend(model_runner)


# ------------------------------------------------------------------ memory plan
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
                                graph_max_bs=graph_max_bs_fn(kvc.device), config=config)
    log.info("oscar int2: KV budget %d B fits %d tokens (%d B of INT2 pages), %d request rows, "
             "%d BF16 window slots (%d B, %d spares for decode graphs up to batch %d), sink "
             "store %d B (before SGLang's --max-total-tokens / --max-running-requests caps, "
             "if given; the pool is logged when built)", available_bytes,
             plan.max_total_num_tokens, plan.page_bytes, plan.max_running_requests,
             plan.window_slots, plan.window_bytes, max(plan.graph_max_bs - 1, 0),
             plan.graph_max_bs, plan.sink_store_bytes)
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
    allocates its window slots for them: :meth:`PluginState.planned_rows`)."""
    sizes = kwargs.get("sizes", args[0] if args else None)
    if not int2_enabled() or sizes is None:
        return original(self, *args, **kwargs)
    with STATE.planning(int(sizes.max_running_requests)):
        return original(self, *args, **kwargs)


# ----------------------------------------------------------- request rows, prefixes
def _after_alloc_rows(result, pool, *args, **kwargs):
    if result is not None and int2_enabled():
        STATE.mark_fresh_rows(result)
    return result


def _req_sink_key(req, sink_size: int):
    extra = (getattr(req, "extra_key", None), getattr(req, "lora_id", None))
    return sink_key(list(req.origin_input_ids[:sink_size]), sink_size, extra)


def _after_alloc(result, pool, reqs, *args, **kwargs):
    """Remember each request row's sink key (the backend stores/restores sinks by it)."""
    if result is not None and int2_enabled():
        s = OscarConfig.from_env().sink_size
        for req, row in zip(reqs, result):
            STATE.set_row_sink_key(int(row), _req_sink_key(req, s))
    return result


def _around_match_kv_cache(original, req, tree_cache, token_ids=None, *args, **kwargs):
    """Cut a new request's prefix hit so its window is recomputed (reusable_prefix_len)."""
    result = original(req, tree_cache, token_ids, *args, **kwargs)
    if not int2_enabled() or getattr(getattr(req, "kv", None), "holds_kv", False):
        return result  # a running request (chunked prefill) keeps its own valid window
    p = int(getattr(req, "prefix_len", 0) or 0)
    if p <= 0:
        return result
    cfg = OscarConfig.from_env()
    keep = reusable_prefix_len(p, sink_size=cfg.sink_size, recent_size=cfg.recent_size,
                               page_size=STATE.page_size,
                               have_sinks=cfg.sink_size == 0
                               or STATE.has_sink_entry(_req_sink_key(req, cfg.sink_size)))
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
