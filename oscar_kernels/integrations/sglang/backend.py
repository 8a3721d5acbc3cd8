"""The INT2 attention backend of SGLang: decode and extend over the INT2 pool.

:class:`OscarInt2AttnBackend` subclasses SGLang's ``AttentionBackend`` (this module imports
SGLang). It plans the FlashInfer-shaped wrappers once per forward (page table from
``req_to_token``) and runs them per layer with that layer's cache and rotation: extend =
:class:`~oscar_kernels.integrations.flashinfer.Int2BatchPrefillWithPagedKVCacheWrapper`
(writes the chunk, causal attention), decode =
:func:`~oscar_kernels.integrations.flashinfer.append_paged_kv_cache` of the new token + the
decode wrapper. A request row that SGLang has just assigned and that starts on a cached
prefix (cut by the prefix-match hook so its last ``recent_size`` tokens are recomputed) gets
its sinks from the pool's sink store and its older ring rows rebuilt from pages before its
first extend.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from ...errors import UnsupportedConfigError
from ..flashinfer import (Int2BatchDecodeWithPagedKVCacheWrapper,
                          Int2BatchPrefillWithPagedKVCacheWrapper, append_paged_kv_cache)
from .pages import page_table_from_req_to_token, rebuild_window_from_pages
from .pool import OscarInt2TokenToKVPool

log = logging.getLogger(__name__)


class OscarInt2AttnBackend(AttentionBackend):
    """Decode and extend over :class:`OscarInt2TokenToKVPool` through the public ops."""

    def __init__(self, model_runner):
        super().__init__()
        pool = model_runner.token_to_kv_pool
        if not isinstance(pool, OscarInt2TokenToKVPool):
            raise UnsupportedConfigError(
                f"OscarInt2AttnBackend needs the INT2 pool, got {type(pool).__name__} "
                "(hybrid/SWA/unified pools are not supported with --kv-cache-dtype int2)")
        self.pool = pool
        self.state = pool.state
        self.device = torch.device(model_runner.device)
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.page_size = pool.page_size
        self.num_rows = self.req_to_token_pool.req_to_token.shape[0]
        if pool.num_window_slots < self.num_rows:
            raise UnsupportedConfigError(
                f"--kv-cache-dtype int2: SGLang's request pool has {self.num_rows} rows "
                f"(with the padding row); the INT2 pool was planned with "
                f"{pool.num_window_slots} window slots")
        #: slots after the request rows, for repeated CUDA-graph padding rows
        self.spare_slots = pool.num_window_slots - self.num_rows
        ws = torch.empty(0, dtype=torch.uint8, device=self.device)
        backend = pool.config.backend
        self.decode_wrapper = Int2BatchDecodeWithPagedKVCacheWrapper(ws, backend=backend)
        self.prefill_wrapper = Int2BatchPrefillWithPagedKVCacheWrapper(ws, backend=backend)
        self.graph_wrappers: dict[int, Int2BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata = None
        self.num_qo_heads = _rank_qo_heads(model_runner, pool)

    # ------------------------------------------------------------ metadata
    def _window_slots(self, req_pool_indices_cpu: torch.Tensor) -> torch.Tensor:
        """Request rows as window slots; repeated rows (CUDA-graph padding) get spare slots."""
        rows = req_pool_indices_cpu.to(torch.int64).tolist()
        seen, out, spare = set(), [], self.num_rows
        for r in rows:
            if r in seen:
                out.append(spare)
                spare += 1
            else:
                seen.add(r)
                out.append(r)
        if spare > self.num_rows + self.spare_slots:
            raise UnsupportedConfigError(
                f"--kv-cache-dtype int2: a batch of {len(rows)} entries repeats request rows "
                f"{spare - self.num_rows} times; the memory plan reserved {self.spare_slots} "
                "spare window slots (decode CUDA-graph padding, --cuda-graph-max-bs-decode)")
        return torch.tensor(out, dtype=torch.int32)

    def _plan(self, forward_batch, wrapper=None):
        fb = forward_batch
        rows_cpu = (fb.req_pool_indices_cpu if getattr(fb, "req_pool_indices_cpu", None)
                    is not None else fb.req_pool_indices.cpu())
        lens_cpu = fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens.cpu()
        kv_indptr, kv_indices, last = page_table_from_req_to_token(
            self.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens,
            self.page_size, seq_lens_cpu=lens_cpu)
        slots = self._window_slots(rows_cpu).to(self.device)
        spec = self.pool.spec
        h = spec.num_kv_heads
        meta = {"slots": slots, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
                "last": last, "lens_cpu": lens_cpu.to(torch.int64)}
        if fb.forward_mode.is_decode():
            w = wrapper or self.decode_wrapper
            w.plan(kv_indptr, kv_indices, last, self.num_qo_heads, h, spec.head_dim,
                   spec.page_size, window_slots=slots, spec=None)
            meta["wrapper"] = w
            bs = len(lens_cpu)
            positions = (lens_cpu - 1).clamp(min=0).to(torch.int32)
            if wrapper is not None:  # graph mode: the captured append reads these buffers
                gb = self.graph_buffers
                gb["positions"][:bs].copy_(positions, non_blocking=True)
                meta["batch_indices"] = gb["batch_indices"][:bs]
                meta["positions"] = gb["positions"][:bs]
            else:
                meta["batch_indices"] = torch.arange(bs, dtype=torch.int32, device=self.device)
                meta["positions"] = positions.to(self.device)
        else:
            ext = fb.extend_seq_lens_cpu
            pre = fb.extend_prefix_lens_cpu
            qo = torch.zeros(len(ext) + 1, dtype=torch.int32)
            qo[1:] = torch.cumsum(torch.tensor(ext, dtype=torch.int64), 0).to(torch.int32)
            self.prefill_wrapper.plan(qo.to(self.device), kv_indptr, kv_indices, last,
                                      self.num_qo_heads, h, spec.head_dim, spec.page_size,
                                      causal=True, window_slots=slots)
            meta["wrapper"] = self.prefill_wrapper
            rebuild, store = [], []
            ip = kv_indptr.cpu()
            s_ = spec.sink_size
            for b, row in enumerate(rows_cpu.tolist()):
                p, n, key = int(pre[b]), int(lens_cpu[b]), self.state.row_sink_key(row)
                if self.state.is_fresh(row) and p > 0:
                    # a new request on a cached prefix: its slot holds another request's rows
                    npages = -(-p // self.page_size)
                    rebuild.append((int(slots[b]), p, self.pool.sink_lookup(key),
                                    kv_indices[int(ip[b]):int(ip[b]) + npages]))
                if p < s_ <= n:  # this forward completes the sinks: keep them for reuse
                    entry = self.pool.sink_assign(key)
                    if entry is not None:
                        store.append((int(slots[b]), entry))
            meta["rebuild"], meta["store"] = rebuild, store
        self.state.clear_fresh(rows_cpu.tolist())
        return meta

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_idle():
            self.forward_metadata = None
            return
        self.forward_metadata = self._plan(forward_batch)

    # -------------------------------------------------------- CUDA graphs
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        """Persistent page-table buffers for decode graphs, one wrapper per batch size.

        A batch padded to ``max_bs`` entries (at capture: ``max_bs`` copies of the padding
        row 0) needs ``max_bs - 1`` spare window slots; the pool holds the spares the
        memory plan reserved for the largest decode batch SGLang captures, so nothing is
        allocated here. Raises ``UnsupportedConfigError`` when they do not suffice.
        """
        if max_bs - 1 > self.spare_slots:
            raise UnsupportedConfigError(
                f"--kv-cache-dtype int2: decode CUDA graphs up to batch {max_bs} need "
                f"{max_bs - 1} spare window slots; the memory plan reserved "
                f"{self.spare_slots} (--cuda-graph-max-bs-decode, --cuda-graph-bs-decode)")
        max_pages = -(-self.req_to_token_pool.req_to_token.shape[1] // self.page_size)
        self.graph_buffers = {
            "indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
            "indices": torch.zeros(max_bs * max_pages, dtype=torch.int32, device=self.device),
            "last": torch.ones(max_bs, dtype=torch.int32, device=self.device),
            "slots": torch.zeros(max_bs, dtype=torch.int32, device=self.device),
            "positions": torch.zeros(max_bs, dtype=torch.int32, device=self.device),
            "batch_indices": torch.arange(max_bs, dtype=torch.int32, device=self.device),
        }

    def _graph_wrapper(self, bs: int) -> Int2BatchDecodeWithPagedKVCacheWrapper:
        w = self.graph_wrappers.get(bs)
        if w is None:
            b = self.graph_buffers
            w = Int2BatchDecodeWithPagedKVCacheWrapper(
                torch.empty(0, dtype=torch.uint8, device=self.device), "NHD", True, False,
                b["indptr"][: bs + 1], b["indices"], b["last"][:bs],
                window_slots_buffer=b["slots"][:bs], backend=self.pool.config.backend)
            self.graph_wrappers[bs] = w
        return w

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        """Host side of capture and replay: plan into the persistent buffers."""
        if not forward_batch.forward_mode.is_decode():
            return self.init_forward_metadata(forward_batch)
        self.forward_metadata = self._plan(
            forward_batch, self._graph_wrapper(forward_batch.batch_size))

    def init_forward_metadata_in_graph(self, forward_batch):
        """Nothing to record: run() reads the buffers planned out of graph."""

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    # ------------------------------------------------------------- forward
    def _check_layer(self, layer):
        if getattr(layer, "logit_cap", 0) and layer.logit_cap > 0:
            raise UnsupportedConfigError(f"layer {layer.layer_id}: logit soft-capping is not "
                                         "supported with --kv-cache-dtype int2")
        if getattr(layer, "sliding_window_size", -1) not in (None, -1):
            raise UnsupportedConfigError(f"layer {layer.layer_id}: sliding-window attention is "
                                         "not supported with --kv-cache-dtype int2")
        if getattr(layer, "is_cross_attention", False):
            raise UnsupportedConfigError("cross attention is not supported with int2")

    def _shapes(self, q, k, v, layer):
        d = layer.qk_head_dim
        q3 = q.reshape(-1, layer.tp_q_head_num, d)
        k3 = k.reshape(-1, layer.tp_k_head_num, d)
        v3 = v.reshape(-1, layer.tp_k_head_num, d)
        return q3, k3, v3

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer)
        if k is None or v is None or not save_kv_cache:
            raise UnsupportedConfigError("int2 extend needs the new K/V (save_kv_cache=True)")
        meta = self.forward_metadata
        cache = self.pool.layer_cache(layer.layer_id)
        sk, sv = self.pool.sink_store[layer.layer_id - self.pool.start_layer]
        s_ = self.pool.spec.sink_size
        for slot, prefix_len, entry, pages in meta["rebuild"]:
            if entry is not None:  # exact BF16 sinks of this prefix
                cache.k_window[slot, :s_] = sk[entry]
                cache.v_window[slot, :s_] = sv[entry]
            elif prefix_len > 0 and s_ > 0:
                log.warning("oscar int2: sink rows of a reused prefix were evicted from the "
                            "sink store; rebuilding them from INT2 pages")
            # ring rows before the reused prefix end; only the recomputed queries read them
            rebuild_window_from_pages(cache, pages, slot, prefix_len, sinks=entry is None)
        q3, k3, v3 = self._shapes(q, k, v, layer)
        meta["wrapper"]._plan["sm_scale"] = float(layer.scaling)
        o = meta["wrapper"].run(q3, k3, v3, cache,
                                rotation=self.pool.layer_rotation(layer.layer_id))
        for slot, entry in meta["store"]:
            sk[entry] = cache.k_window[slot, :s_]
            sv[entry] = cache.v_window[slot, :s_]
        return o.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer)
        meta = self.forward_metadata
        cache = self.pool.layer_cache(layer.layer_id)
        rot = self.pool.layer_rotation(layer.layer_id)
        q3, k3, v3 = self._shapes(q, k, v, layer)
        if save_kv_cache and k is not None:
            plan = meta["wrapper"]._plan  # the planned (possibly persistent) device tables
            append_paged_kv_cache(k3, v3, meta["batch_indices"], meta["positions"], cache,
                                  plan["indices"], plan["indptr"], plan["last_page_len"],
                                  window_slots=plan["window_slots"], rotation=rot,
                                  backend=self.pool.config.backend, check_bounds=False)
        # one plan serves all layers; the softmax scale is the layer's (RadixAttention.scaling)
        meta["wrapper"]._plan["sm_scale"] = float(layer.scaling)
        o = meta["wrapper"].run(q3, cache, rotation=rot)
        return o.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)


def _rank_qo_heads(model_runner, pool) -> int:
    """Query heads on this rank: the model's heads over the attention TP size."""
    override = getattr(pool, "num_qo_heads", None)
    if override:
        return int(override)
    from sglang.srt.runtime_context import get_parallel

    return model_runner.model_config.get_num_attention_heads(get_parallel().attn_tp_size)
