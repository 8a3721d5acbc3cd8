"""The INT2 KV pool of SGLang: one :class:`~oscar_kernels.cache.Int2PagedKVCache` per layer.

:class:`OscarInt2TokenToKVPool` subclasses SGLang's ``KVCache`` (this module imports SGLang).
SGLang's token slots map to pages of ``page_size`` slots (``--page-size``, 1 by default):
slot ``s`` is page ``s // page_size``, row ``s % page_size``. Window slots are SGLang's
request rows (``req_pool_indices``), plus spare slots for CUDA-graph padding, all allocated
with the pool as planned (:mod:`.memory_plan`); the backend only checks that they suffice
and never allocates window memory. The pool also keeps the BF16 sink store of prefix
caching (docs/integrations.md, "Prefix caching").

:func:`build_int2_pool` replaces ``KVCacheConfigurator._build_mha_kv_pool`` under ``int2``:
it checks the model, loads the artifact and slices it to this rank's KV heads.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch
from sglang.srt.mem_cache.memory_pool import KVCache

from ...cache import Int2PagedKVCache
from ...errors import UnsupportedConfigError
from ...rotation import ModelFingerprint
from ...spec import CacheSpec
from .artifact import load_rotation_artifact, rank_rotations
from .checks import check_model
from .config import OscarConfig
from .cuda_graphs import graph_max_bs_fn
from .memory_plan import int2_window_slots
from .state import PluginState

log = logging.getLogger(__name__)


class OscarInt2TokenToKVPool(KVCache):
    """SGLang KV pool storing the INT2 format (docs/format.md): one cache per layer.

    Parameters
    ----------
    size, page_size, layer_num, device, enable_memory_saver, start_layer, end_layer
        As SGLang's ``MHATokenToKVPool``.
    head_num, head_dim : int
        This TP rank's KV heads and the head dim.
    rotations : list[LayerRotation]
        This rank's rotations for layers ``start_layer..end_layer`` (already sharded).
    config : OscarConfig
    state : PluginState
        The process's plugin state; the pool registers itself there (the prefix-match hook
        asks it about stored sinks) and the attention backend reads request rows from it.
    num_window_slots : int
        BF16 window slots of every layer (:func:`planned_window_slots`: request rows,
        padding row, CUDA-graph spares); fixed for the pool's lifetime.
    dtype : torch.dtype
        The model dtype (what ``get_key_buffer`` users would expect; INT2 has no such buffer).
    """

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int,
                 head_dim: int, layer_num: int, device: str, enable_memory_saver: bool, *,
                 rotations, config: OscarConfig, state: PluginState,
                 start_layer: int | None = None, end_layer: int | None = None,
                 num_window_slots: int = 1, **_ignored):
        super().__init__(size, page_size, dtype, layer_num, device, enable_memory_saver,
                         start_layer, end_layer)
        self.head_num, self.head_dim = head_num, head_dim
        self.config = config
        self.state = state
        self.spec = CacheSpec(num_kv_heads=head_num, head_dim=head_dim, page_size=page_size,
                              group_size=config.group_size, sink_size=config.sink_size,
                              recent_size=config.recent_size)
        self.num_pages = (size + page_size) // page_size + 1  # memory_plan.int2_pool_pages
        self.rotations = rotations
        self.layers = [Int2PagedKVCache.allocate(self.spec, self.num_pages, num_window_slots,
                                                 device=device)
                       for _ in range(self.end_layer - self.start_layer + 1)]
        # sink store: BF16 rows [0, S) per distinct first-S-token prefix (LRU), per layer;
        # its bytes (memory_plan.int2_sink_store_bytes) are taken out of SGLang's KV budget
        e, s_ = config.sink_entries, config.sink_size
        shape = (e, s_, head_num, head_dim)
        self.sink_store = [(torch.empty(shape, dtype=torch.bfloat16, device=device),
                            torch.empty(shape, dtype=torch.bfloat16, device=device))
                           for _ in self.layers]
        self.sink_index: OrderedDict[str, int] = OrderedDict()
        self._finalize_allocation_log(size)
        state.pool = self

    # ------------------------------------------------------------ sink store
    def sink_lookup(self, key: str | None) -> int | None:
        if key is None or key not in self.sink_index:
            return None
        self.sink_index.move_to_end(key)
        return self.sink_index[key]

    def sink_assign(self, key: str | None) -> int | None:
        """Entry for ``key`` (reused, or the least recently used one evicted)."""
        if key is None or self.config.sink_size == 0 or self.config.sink_entries == 0:
            return None
        if key in self.sink_index:
            return self.sink_lookup(key)
        if len(self.sink_index) < self.config.sink_entries:
            entry = len(self.sink_index)
        else:
            _, entry = self.sink_index.popitem(last=False)
        self.sink_index[key] = entry
        return entry

    # -------------------------------------------------------------- accessors
    def layer_cache(self, layer_id: int) -> Int2PagedKVCache:
        return self.layers[layer_id - self.start_layer]

    def layer_rotation(self, layer_id: int):
        return self.rotations[layer_id - self.start_layer]

    @property
    def num_window_slots(self) -> int:
        return self.layers[0].num_window_slots

    def get_kv_size_bytes(self):
        k = sum(c.k_codes.nbytes + c.k_params.nbytes + c.k_window.nbytes + sk.nbytes
                for c, (sk, _) in zip(self.layers, self.sink_store))
        v = sum(c.v_codes.nbytes + c.v_params.nbytes + c.v_window.nbytes + sv.nbytes
                for c, (_, sv) in zip(self.layers, self.sink_store))
        return k, v

    def _unsupported(self, what: str):
        raise UnsupportedConfigError(f"OscarInt2TokenToKVPool.{what}: the INT2 pool has no "
                                     "BF16 K/V buffer; only OscarInt2AttnBackend reads it")

    def get_key_buffer(self, layer_id: int):
        self._unsupported("get_key_buffer")

    def get_value_buffer(self, layer_id: int):
        self._unsupported("get_value_buffer")

    def get_kv_buffer(self, layer_id: int):
        self._unsupported("get_kv_buffer")

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, *args, **kwargs):
        self._unsupported("set_kv_buffer (writes need each token's sequence position; "
                          "the attention backend writes)")


def planned_window_slots(max_running_requests: int, device) -> int:
    """Window slots the INT2 pool allocates for SGLang's request rows: the rows, the padding
    row and the CUDA-graph spares, as :func:`~.memory_plan.int2_memory_plan` counted them."""
    rows = int(max_running_requests)
    return int2_window_slots(rows, graph_max_bs=int(graph_max_bs_fn(device)(rows)))


def build_int2_pool(configurator, state: PluginState, *, max_total_num_tokens: int,
                    mha_pool_class=None, quant_method=None, **_) -> OscarInt2TokenToKVPool:
    """Replacement of ``KVCacheConfigurator._build_mha_kv_pool`` under ``int2``."""
    from sglang.srt.runtime_context import get_parallel

    mc = configurator.model_config
    if getattr(configurator, "post_capture_kv_active", False):
        # SGLang would re-plan the pool from the free memory after CUDA-graph capture, with
        # this pool's sink store already allocated (counted twice) and no VMM backing here.
        raise UnsupportedConfigError("--kv-cache-dtype int2 does not support post-capture KV "
                                     "sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1): the "
                                     "INT2 pool is allocated at its planned size")
    check_model(use_mla=bool(getattr(configurator, "use_mla_backend", False))
                or str(getattr(mc, "attention_arch", "")).endswith("MLA"),
                head_dim=mc.head_dim, v_head_dim=getattr(mc, "v_head_dim", None),
                architecture=str(getattr(mc.hf_config, "architectures", "")))
    par = get_parallel()
    tp_size, tp_rank = par.attn_tp_size, par.attn_tp_rank
    config = OscarConfig.from_env()
    fp = ModelFingerprint(num_layers=mc.num_hidden_layers,
                          num_kv_heads=mc.get_total_num_kv_heads(),
                          num_qo_heads=mc.num_attention_heads, head_dim=mc.head_dim)
    artifact = load_rotation_artifact(config.rotation_path, fp)
    li = configurator.layer_info  # SGLang's [start_layer, end_layer) of this runner
    first, last = li.start_layer, li.start_layer + li.num_effective_layers - 1
    rotations = rank_rotations(artifact, tp_rank=tp_rank, tp_size=tp_size, start_layer=first,
                               end_layer=last, device=configurator.device)
    head_num = mc.get_num_kv_heads(tp_size)
    slots = planned_window_slots(state.planned_rows(), configurator.device)
    log.info("oscar int2: pool for layers %d..%d, %d KV heads (rank %d/%d), page_size %d, "
             "artifact %s (%s)", first, last, head_num, tp_rank, tp_size,
             configurator.pool_page_size, config.rotation_path, artifact.method)
    log.info("oscar int2: %d BF16 window slots per layer (request rows, padding row, "
             "CUDA-graph spares)", slots)
    return OscarInt2TokenToKVPool(
        max_total_num_tokens, configurator.pool_page_size, configurator.kv_cache_dtype,
        head_num, mc.head_dim, li.num_effective_layers, configurator.device, False,
        rotations=rotations, config=config, state=state, start_layer=first, end_layer=last,
        num_window_slots=slots)
