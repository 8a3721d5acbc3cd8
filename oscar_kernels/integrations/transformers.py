"""Hugging Face ``transformers`` integration: run a decoder model with the OSCAR INT2 cache.

Two ways, one attention function (registered as ``"oscar"`` with
``transformers.AttentionInterface``; it receives the post-RoPE ``q``/``k``/``v`` of every
layer, so no model code is copied):

* **Generation through the real packed cache.** :class:`OscarCache` (a
  ``transformers.cache_utils.Cache``) holds one :class:`oscar_kernels.cache.Int2PagedKVCache`
  per layer. A prefill chunk goes through :func:`oscar_kernels.ops.paged_extend_attention`,
  each decoded token through :func:`~oscar_kernels.ops.quantize_append_paged_kv_cache` plus
  :func:`~oscar_kernels.ops.paged_decode_attention` (``backend="auto"``: the reference on
  a CPU). The bytes are exactly those of docs/format.md.
* **Exact teacher-forced emulation.** With a scheme attached (:func:`attach_scheme`) and
  no :class:`OscarCache`, one forward pass scores a whole sequence under the serving read
  rule: query ``t`` reads position ``p`` in BF16 when ``p < sink_size`` or
  ``p > t - recent_size`` and the INT2 (rotated, clipped, quantized, dequantized) value
  otherwise. The quantizer is :func:`oscar_kernels.reference.quant.quantize_groups`;
  the attention is :func:`oscar_kernels.reference.paged.window_rule_attention` or its
  banded equivalent (:func:`banded_window_attention`, the same numbers up to float32
  summation order, about 2x cheaper on long sequences). Works with no cache (scoring)
  or a stock ``DynamicCache`` (emulated generation), and with any other per-layer rule
  that implements :class:`EmulationRule` (the KIVI baseline of the evaluation does).

Supported: decoder models whose attention modules call the attention interface with
post-RoPE states and have ``layer_idx`` (Llama, Mistral, Qwen2, Qwen3 in transformers
5.x), full causal attention, unpadded batches (sequences of one length). A sliding
window shorter than the sequence raises :class:`~oscar_kernels.errors.UnsupportedConfigError`.

Example
-------
>>> from oscar_kernels.integrations.transformers import (OscarCache, Int2Scheme,
...     attach_scheme)                                                  # doctest: +SKIP
>>> scheme = Int2Scheme.from_artifact(RotationArtifact.load("rot.safetensors"))  # doctest: +SKIP
>>> with attach_scheme(model, scheme):                                  # doctest: +SKIP
...     logits = model(ids).logits                     # teacher-forced emulation
...     cache = OscarCache(model.config, scheme, max_batch_size=1, max_cache_len=4096)
...     out = model(ids, past_key_values=cache, use_cache=True)         # packed cache
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..cache import Int2PagedKVCache
from ..errors import UnsupportedConfigError, expect
from ..reference.paged import (rotate, rotate_queries, unrotate_output,
                               window_rule_attention)
from ..reference.quant import dequantize_groups, quantize_groups
from ..rotation import LayerRotation, ModelFingerprint, RotationArtifact
from ..spec import DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE, CacheSpec

log = logging.getLogger(__name__)

ATTN_IMPLEMENTATION = "oscar"
_SCHEME_ATTR = "_oscar_rule"
_LAYER_TAG = "_oscar_cache_layer"
DEFAULT_QUERY_CHUNK = 256


# --------------------------------------------------------------------- model facts
def model_fingerprint(config) -> ModelFingerprint:
    """:class:`~oscar_kernels.rotation.ModelFingerprint` of a ``transformers`` config."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_qo = int(cfg.num_attention_heads)
    num_kv = int(getattr(cfg, "num_key_value_heads", None) or num_qo)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_qo
    return ModelFingerprint(int(cfg.num_hidden_layers), num_kv, num_qo, int(head_dim))


def attention_modules(model) -> list[torch.nn.Module]:
    """The self-attention modules of ``model`` in layer order (those with ``layer_idx``
    and a ``k_proj``), one per decoder layer."""
    mods = [m for m in model.modules()
            if hasattr(m, "layer_idx") and hasattr(m, "k_proj") and hasattr(m, "q_proj")]
    mods.sort(key=lambda m: m.layer_idx)
    return mods


# ------------------------------------------------------------------ emulation rules
class EmulationRule(Protocol):
    """One layer's teacher-forced attention rule.

    ``emulate(q [Tq, Hq, D], k [L, H, D], v [L, H, D], q_positions [Tq], sm_scale)``
    returns ``o [Tq, Hq, D]`` float32 in the model's space; ``k``/``v`` are the layer's
    post-RoPE keys and values of positions ``0..L-1`` (one sequence).
    """

    def emulate(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_positions: torch.Tensor, sm_scale: float) -> torch.Tensor: ...


def quantize_dequantize(x_rot: torch.Tensor, group_size: int, ratio: float,
                        scale_dtype: torch.dtype) -> torch.Tensor:
    """What the INT2 pages return for rotated rows ``x_rot [..., D]`` float32: the
    reference quantizer followed by its dequantizer (docs/format.md section 2)."""
    codes, scale, zero = quantize_groups(x_rot, group_size, ratio, scale_dtype)
    return dequantize_groups(codes, scale, zero, group_size)


def banded_window_attention(q_rot: torch.Tensor, q_positions: torch.Tensor,
                            k_int2: torch.Tensor, v_int2: torch.Tensor,
                            k_bf16: torch.Tensor, v_bf16: torch.Tensor,
                            sink_size: int, recent_size: int, sm_scale: float) -> torch.Tensor:
    """:func:`~oscar_kernels.reference.paged.window_rule_attention`, computed densely over
    the INT2 values with the BF16 reads applied as a correction on two column slices only:
    the sink ``[0, sink_size)`` and the band ``[min(t) - recent_size + 1, max(t)]``.

    Same arguments and read rule; keys are cut at ``max(t) + 1``. Returns
    ``o_rot [Nq, Hq, D]`` float32 (rotated space). Meant for query chunks of nearby
    positions: the band is as wide as the chunk's spread plus ``recent_size``. Equal to
    the reference up to float32 summation order (tested).
    """
    kv = _head_major(k_int2, v_int2, k_bf16, v_bf16)
    return _banded(q_rot, q_positions, kv, sink_size, recent_size, sm_scale)


def _head_major(k_int2, v_int2, k_bf16, v_bf16):
    """``[L, H, D]`` operands → contiguous ``K^T [H, D, L]`` (INT2, BF16), ``V [H, L, D]``
    (INT2) and the BF16 correction ``V_bf16 - V_int2 [H, L, D]``."""
    kt = lambda x: x.permute(1, 2, 0).contiguous()  # noqa: E731
    vh = lambda x: x.permute(1, 0, 2).contiguous()  # noqa: E731
    return kt(k_int2), kt(k_bf16), vh(v_int2), vh(v_bf16 - v_int2)


def _banded(q_rot, q_positions, kv, sink_size, recent_size, sm_scale):
    kt_int2, kt_bf16, v_int2, dv = kv
    nq, hq, d = q_rot.shape
    h = kt_int2.shape[0]
    g = hq // h
    t = q_positions.to(torch.int64)
    length = int(t.max()) + 1
    lo = max(int(t.min()) - recent_size + 1, 0)          # band [lo, length); lo <= min(t)
    sink = min(sink_size, lo)                            # sink columns left of the band
    # rows ordered (group member, query) so [Nq, L] masks broadcast over [H, g, Nq, L]
    qh = (q_rot * sm_scale).reshape(nq, h, g, d).permute(1, 2, 0, 3).reshape(h, g * nq, d)
    s = torch.bmm(qh, kt_int2[:, :, :length]).view(h, g, nq, length)
    if sink:
        s[..., :sink] = torch.bmm(qh, kt_bf16[:, :, :sink]).view(h, g, nq, sink)
    pos = torch.arange(lo, length, device=q_rot.device)
    rel = pos[None, :] - t[:, None]                                         # [Nq, B]
    band_full = ((rel > -recent_size) | (pos[None, :] < sink_size)) & (rel <= 0)
    sb = torch.bmm(qh, kt_bf16[:, :, lo:length]).view(h, g, nq, length - lo)
    sb = torch.where(band_full, sb, s[..., lo:length])
    s[..., lo:length] = sb.masked_fill_(rel > 0, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p2 = p.view(h, g * nq, length)
    o = torch.bmm(p2, v_int2[:, :length])                                   # [H, g*Nq, D]
    if sink:
        o += torch.bmm(p2[..., :sink], dv[:, :sink])
    pb = (p[..., lo:length] * band_full).view(h, g * nq, length - lo)
    o += torch.bmm(pb, dv[:, lo:length])
    return o.view(h, g, nq, d).permute(2, 0, 1, 3).reshape(nq, hq, d)


@dataclass
class Int2LayerRule:
    """The serving rule of format v1 for one layer (rotation, clip ratios, windows).

    ``attention="banded"`` (default) uses :func:`banded_window_attention`,
    ``"reference"`` the reference :func:`window_rule_attention` itself; both process
    queries in chunks of ``query_chunk`` with keys cut at the chunk's last position.
    """

    rotation: LayerRotation
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    group_size: int | None = None
    scale_dtype: torch.dtype = torch.float16
    attention: str = "banded"
    query_chunk: int = DEFAULT_QUERY_CHUNK

    def emulate(self, q, k, v, q_positions, sm_scale):
        h, d = k.shape[1], k.shape[2]
        gs = self.group_size or d
        rk, rv = self.rotation.per_head(h)
        rk, rv = rk.to(k.device), rv.to(k.device)
        kr, vr = rotate(k, rk), rotate(v, rv)
        k_int2 = quantize_dequantize(kr, gs, float(self.rotation.k_clip), self.scale_dtype)
        v_int2 = quantize_dequantize(vr, gs, float(self.rotation.v_clip), self.scale_dtype)
        k_bf16 = kr.to(torch.bfloat16).to(torch.float32)
        v_bf16 = vr.to(torch.bfloat16).to(torch.float32)
        q_rot = rotate_queries(q, rk)
        out = torch.empty(q_rot.shape, dtype=torch.float32, device=q.device)
        kv = None
        for a in range(0, q.shape[0], self.query_chunk):
            b = min(a + self.query_chunk, q.shape[0])
            t = q_positions[a:b]
            n = int(t.max()) + 1
            if self.attention == "reference":
                o, _ = window_rule_attention(q_rot[a:b], t, k_int2[:n], v_int2[:n], k_bf16[:n],
                                             v_bf16[:n], self.sink_size, self.recent_size,
                                             sm_scale)
            else:
                if kv is None:
                    kv = _head_major(k_int2, v_int2, k_bf16, v_bf16)
                o = _banded(q_rot[a:b], t, kv, self.sink_size, self.recent_size, sm_scale)
            out[a:b] = o
        return unrotate_output(out, rv)


@dataclass
class Int2Scheme:
    """Format v1 settings for every layer of a model: rotations and clips (one
    :class:`~oscar_kernels.rotation.LayerRotation` per layer) plus the cache geometry.

    Parameters
    ----------
    layers : list of LayerRotation
    sink_size, recent_size, group_size, scale_dtype, page_size, kv_layout
        As in :class:`~oscar_kernels.spec.CacheSpec` (``group_size=None`` means
        ``head_dim``).
    attention : {"banded", "reference"}
        Teacher-forced attention implementation (see :class:`Int2LayerRule`).
    backend : str
        ``backend=`` of the ops used by :class:`OscarCache`.
    """

    layers: list[LayerRotation]
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    group_size: int | None = None
    scale_dtype: torch.dtype = torch.float16
    page_size: int = 16
    kv_layout: str = "NHD"
    attention: str = "banded"
    backend: str = "auto"
    query_chunk: int = DEFAULT_QUERY_CHUNK

    def __post_init__(self) -> None:
        expect(isinstance(self.layers, (list, tuple)) and len(self.layers) > 0
               and all(isinstance(x, LayerRotation) for x in self.layers),
               "layers", "a non-empty list of LayerRotation", self.layers, TypeError)
        expect(self.attention in ("banded", "reference"), "attention",
               "'banded' or 'reference'", self.attention)
        expect(isinstance(self.query_chunk, int) and self.query_chunk > 0, "query_chunk",
               "a positive int", self.query_chunk)
        # validates the geometry once, with the first layer's head_dim
        self.spec(1)

    @classmethod
    def from_artifact(cls, artifact: RotationArtifact, *, k_clip: float | None = None,
                      v_clip: float | None = None, **kwargs) -> "Int2Scheme":
        """Scheme of a rotation artifact; ``k_clip``/``v_clip`` override every layer's
        clip ratio (the "fixed" policy), ``None`` keeps the artifact's (per-layer)."""
        expect(isinstance(artifact, RotationArtifact), "artifact", "a RotationArtifact",
               artifact, TypeError)
        layers = [LayerRotation(lr.rot_k, lr.rot_v,
                                lr.k_clip if k_clip is None else float(k_clip),
                                lr.v_clip if v_clip is None else float(v_clip))
                  for lr in artifact.layers]
        for i, lr in enumerate(layers):
            lr.validate(f"layers[{i}]")
        return cls(layers, **kwargs)

    def spec(self, num_kv_heads: int, head_dim: int | None = None) -> CacheSpec:
        """The :class:`CacheSpec` of one layer with ``num_kv_heads`` KV heads."""
        d = head_dim or self.layers[0].head_dim
        return CacheSpec(num_kv_heads=num_kv_heads, head_dim=d, page_size=self.page_size,
                         group_size=self.group_size or d, sink_size=self.sink_size,
                         recent_size=self.recent_size, kv_layout=self.kv_layout,
                         scale_dtype=self.scale_dtype)

    def rule(self, layer_idx: int) -> Int2LayerRule:
        expect(0 <= layer_idx < len(self.layers), "layer_idx",
               f"0 <= layer_idx < {len(self.layers)}", layer_idx)
        return Int2LayerRule(self.layers[layer_idx], self.sink_size, self.recent_size,
                             self.group_size, self.scale_dtype, self.attention,
                             self.query_chunk)

    def rules(self, num_layers: int) -> list[Int2LayerRule]:
        expect(len(self.layers) == num_layers, "scheme.layers",
               f"{num_layers} layers (the model's)", len(self.layers))
        return [self.rule(i) for i in range(num_layers)]


# ------------------------------------------------------------------- the packed cache
class OscarCacheLayer(CacheLayerMixin):
    """One layer of :class:`OscarCache`: an :class:`Int2PagedKVCache` and its page table.

    Sequence ``b`` owns the contiguous pages ``[b * P, (b + 1) * P)`` with
    ``P = ceil(max_cache_len / page_size)`` and window slot ``b``. ``update`` only
    records the new K/V and the length; the attention function appends them (through
    the extend or append op) when it runs, because extend needs the queries too.
    """

    is_compileable = False
    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, layer_idx: int, rotation: LayerRotation, spec: CacheSpec,
                 max_batch_size: int, max_cache_len: int, backend: str = "auto"):
        super().__init__()
        self.layer_idx = layer_idx
        self.rotation = rotation
        self.spec = spec
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        self.backend = backend
        self.pages_per_seq = -(-max_cache_len // spec.page_size)
        self.cache: Int2PagedKVCache | None = None
        self.batch_size = 0
        self.length = 0

    def __repr__(self) -> str:
        return (f"OscarCacheLayer(layer={self.layer_idx}, length={self.length}, "
                f"batch={self.batch_size})")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b = key_states.shape[0]
        expect(b <= self.max_batch_size, "batch size", f"<= max_batch_size={self.max_batch_size}",
               b)
        expect(key_states.shape[1] == self.spec.num_kv_heads, "key_states",
               f"{self.spec.num_kv_heads} KV heads", key_states)
        expect(key_states.shape[-1] == self.spec.head_dim, "key_states",
               f"head_dim {self.spec.head_dim}", key_states)
        self.cache = Int2PagedKVCache.allocate(self.spec, b * self.pages_per_seq, b,
                                               device=key_states.device)
        self.rotation = self.rotation.to(key_states.device)
        self.batch_size = b
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Record ``key_states/value_states [B, H, T, D]`` (post-RoPE) and grow the length.

        Returns the same tensors, tagged so that the ``"oscar"`` attention function
        appends them to this layer's packed cache.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        expect(key_states.shape[0] == self.batch_size, "key_states",
               f"batch size {self.batch_size} (fixed at the first update)", key_states)
        new_len = self.length + key_states.shape[2]
        expect(new_len <= self.max_cache_len, "sequence length",
               f"<= max_cache_len={self.max_cache_len}", new_len)
        self.length = new_len
        setattr(key_states, _LAYER_TAG, self)
        return key_states, value_states

    def page_table(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``kv_indptr, kv_indices, kv_last_page_len, window_slots`` for the current length."""
        ps = self.spec.page_size
        n_pages = -(-self.length // ps)
        b = torch.arange(self.batch_size, device=device, dtype=torch.int32)
        indptr = torch.arange(self.batch_size + 1, device=device, dtype=torch.int32) * n_pages
        indices = (b[:, None] * self.pages_per_seq
                   + torch.arange(n_pages, device=device, dtype=torch.int32)[None]).reshape(-1)
        last = torch.full((self.batch_size,), (self.length - 1) % ps + 1, device=device,
                          dtype=torch.int32)
        return indptr, indices, last, b

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               sm_scale: float) -> torch.Tensor:
        """Append the recorded chunk and attend: ``query [B, Hq, T, D]`` → ``[B, T, Hq, D]``."""
        from .. import ops

        bsz, hq, t, d = query.shape
        h = key.shape[1]
        indptr, indices, last, slots = self.page_table(query.device)
        k = key.transpose(1, 2).reshape(bsz * t, h, d)
        v = value.transpose(1, 2).reshape(bsz * t, h, d)
        q = query.transpose(1, 2).reshape(bsz * t, hq, d)
        if t == 1:
            positions = torch.full((bsz,), self.length - 1, device=q.device, dtype=torch.int32)
            ops.quantize_append_paged_kv_cache(k, v, slots, positions, self.cache, indices,
                                               indptr, last, slots, self.rotation,
                                               backend=self.backend)
            o = ops.paged_decode_attention(q, self.cache, indptr, indices, last, slots,
                                           self.rotation, sm_scale=sm_scale,
                                           backend=self.backend, max_kv_len=self.length)
        else:
            qo_indptr = torch.arange(bsz + 1, device=q.device, dtype=torch.int32) * t
            o = ops.paged_extend_attention(q, k, v, qo_indptr, self.cache, indptr, indices, last,
                                           slots, self.rotation, sm_scale=sm_scale,
                                           backend=self.backend)
        return o.reshape(bsz, t, hq, d)

    # ---------------------------------------------------- CacheLayerMixin surface
    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return self.max_cache_len

    def reset(self) -> None:
        self.length = 0

    def _unsupported(self, *args, **kwargs):
        raise UnsupportedConfigError("OscarCache: cropping, beam reordering and batch "
                                     "reshaping are not supported (greedy/sampled decoding "
                                     "of a fixed batch only)")

    crop = reorder_cache = batch_repeat_interleave = batch_select_indices = _unsupported

    def offload(self):
        pass

    def prefetch(self):
        pass


class OscarCache(Cache):
    """A ``transformers`` Cache whose layers are real packed INT2 caches (format v1).

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's config (layers, heads, head_dim).
    scheme : Int2Scheme
        Rotations, clips and geometry of every layer.
    max_batch_size : int
        Sequences decoded together (fixed at the first forward).
    max_cache_len : int
        Longest sequence; pages are reserved for it.

    The model must run with ``attn_implementation="oscar"`` (see :func:`attach_scheme`
    or :func:`use_oscar_attention`).
    """

    def __init__(self, config, scheme: Int2Scheme, *, max_batch_size: int = 1,
                 max_cache_len: int | None = None):
        expect(isinstance(scheme, Int2Scheme), "scheme", "an Int2Scheme", scheme, TypeError)
        fp = model_fingerprint(config)
        max_len = max_cache_len or int(getattr(config.get_text_config()
                                               if hasattr(config, "get_text_config") else config,
                                               "max_position_embeddings", 4096))
        expect(isinstance(max_len, int) and max_len > 0, "max_cache_len", "a positive int",
               max_len)
        expect(isinstance(max_batch_size, int) and max_batch_size > 0, "max_batch_size",
               "a positive int", max_batch_size)
        expect(len(scheme.layers) == fp.num_layers, "scheme.layers",
               f"{fp.num_layers} layers (the model's)", len(scheme.layers))
        spec = scheme.spec(fp.num_kv_heads, fp.head_dim)
        layers = [OscarCacheLayer(i, scheme.layers[i], spec, max_batch_size, max_len,
                                  scheme.backend) for i in range(fp.num_layers)]
        super().__init__(layers=layers)
        self.scheme = scheme

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the packed caches of all layers (pages + windows)."""
        return sum(layer.cache.nbytes for layer in self.layers if layer.cache is not None)


# ------------------------------------------------------------ the attention function
def _one_sequence_positions(q_len: int, k_len: int, device) -> torch.Tensor:
    return torch.arange(k_len - q_len, k_len, device=device)


def oscar_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None,
                            scaling: float | None = None, dropout: float = 0.0,
                            sliding_window: int | None = None, **kwargs):
    """The ``"oscar"`` attention function (``transformers.AttentionInterface`` signature).

    Parameters
    ----------
    module : torch.nn.Module
        The attention module (``layer_idx``, and the rule set by :func:`attach_scheme`).
    query : Tensor ``[B, Hq, T, D]``
    key, value : Tensor ``[B, H, L, D]``
        Post-RoPE; ``L = T`` without a cache, the whole history with a ``DynamicCache``,
        the new chunk (tagged) with an :class:`OscarCache`.
    attention_mask
        Ignored: the rule is causal and batches are unpadded.

    Returns
    -------
    (Tensor ``[B, T, Hq, D]`` of ``query.dtype``, None)
    """
    sm_scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    if dropout and module.training:
        raise UnsupportedConfigError("oscar attention: dropout in training mode is not supported")
    layer = getattr(key, _LAYER_TAG, None)
    if layer is not None:
        if sliding_window is not None and layer.length > sliding_window:
            raise UnsupportedConfigError(f"oscar attention: sliding_window={sliding_window} "
                                         f"shorter than the sequence ({layer.length})")
        return layer.attend(query, key, value, sm_scale).to(query.dtype), None
    rule = getattr(module, _SCHEME_ATTR, None)
    if rule is None:
        raise UnsupportedConfigError(
            f"oscar attention: layer {getattr(module, 'layer_idx', '?')} has no scheme; use "
            "attach_scheme(model, scheme) or pass an OscarCache")
    bsz, hq, t, d = query.shape
    k_len = key.shape[2]
    if sliding_window is not None and k_len > sliding_window:
        raise UnsupportedConfigError(f"oscar attention: sliding_window={sliding_window} "
                                     f"shorter than the sequence ({k_len})")
    positions = _one_sequence_positions(t, k_len, query.device)
    out = torch.empty(bsz, t, hq, d, dtype=query.dtype, device=query.device)
    for b in range(bsz):
        o = rule.emulate(query[b].transpose(0, 1).to(torch.float32),
                         key[b].transpose(0, 1).to(torch.float32),
                         value[b].transpose(0, 1).to(torch.float32), positions, sm_scale)
        out[b] = o.to(query.dtype)
    return out, None


def register_attention() -> None:
    """Register :func:`oscar_attention_forward` as ``"oscar"`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, oscar_attention_forward)


def _set_impl(model, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = name


@contextlib.contextmanager
def use_oscar_attention(model):
    """Within the block, ``model`` runs the ``"oscar"`` attention function; the previous
    implementation is restored afterwards."""
    register_attention()
    previous = model.config._attn_implementation
    _set_impl(model, ATTN_IMPLEMENTATION)
    try:
        yield model
    finally:
        _set_impl(model, previous)


@contextlib.contextmanager
def attach_scheme(model, scheme):
    """Attach per-layer emulation rules to ``model`` and switch it to ``"oscar"`` attention.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    scheme : Int2Scheme or sequence of EmulationRule
        One rule per decoder layer (an :class:`Int2Scheme` makes its own).

    Within the block, ``model(ids)`` scores under the emulated serving rule and
    ``model(ids, past_key_values=OscarCache(...))`` runs the packed cache.
    """
    mods = attention_modules(model)
    expect(len(mods) > 0, "model", "a decoder with attention modules (layer_idx, q_proj, "
           "k_proj)", type(model).__name__, TypeError)
    rules = scheme.rules(len(mods)) if isinstance(scheme, Int2Scheme) else list(scheme)
    expect(len(rules) == len(mods), "scheme", f"{len(mods)} layer rules (the model's layers)",
           len(rules))
    for m, r in zip(mods, rules):
        setattr(m, _SCHEME_ATTR, r)
    try:
        with use_oscar_attention(model):
            yield model
    finally:
        for m in mods:
            if hasattr(m, _SCHEME_ATTR):
                delattr(m, _SCHEME_ATTR)


__all__ = ["ATTN_IMPLEMENTATION", "EmulationRule", "Int2LayerRule", "Int2Scheme", "OscarCache",
           "OscarCacheLayer", "attach_scheme", "attention_modules", "banded_window_attention",
           "model_fingerprint", "oscar_attention_forward", "quantize_dequantize",
           "register_attention", "use_oscar_attention"]
