"""Capture post-RoPE Q, K, V (and the attention output) of every attention layer.

The hook point is transformers' attention interface: decoder models of the Llama,
Mistral, Qwen2 and Qwen3 families (and every model written the same way) compute
``q = RoPE(q_proj(x))``, ``k = RoPE(k_proj(x))``, ``v = v_proj(x)`` and then call the
function registered under ``config._attn_implementation`` with
``(module, query [B, Hq, T, D], key [B, H, T, D], value [B, H, T, D], attention_mask,
scaling=...)``. :func:`capture_attention` registers one such function,
:data:`CAPTURE_ATTN_NAME`, that hands the tensors to an observer and then runs the real
SDPA attention (so the forward continues unchanged), and switches the model to it for
the duration of a ``with`` block. No model code is copied; keys and values arrive
un-repeated (one per KV head), so everything downstream is GQA-aware.

:func:`check_supported` fails early, with :class:`UnsupportedConfigError` naming the
model class, when the model has no rotary embedding, a ``head_dim`` that is not a power
of two, or attention layers that are not routed through the interface (verified by a
probe forward pass: every layer must call the capture function exactly once).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..errors import UnsupportedConfigError
from ..rotation import ModelFingerprint
from ..spec import is_power_of_two

log = logging.getLogger(__name__)

CAPTURE_ATTN_NAME = "oscar_kv_capture"

#: observer(layer_idx, query [B, Hq, T, D], key [B, H, T, D], value [B, H, T, D],
#:          attn_output [B, T, Hq, D], scaling) -> None
Observer = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], None]

_ACTIVE: list[Observer] = []


def _capture_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                               scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask,
                                          dropout=dropout, scaling=scaling, **kwargs)
    if _ACTIVE:
        layer_idx = getattr(module, "layer_idx", None)
        if layer_idx is None:
            raise UnsupportedConfigError(
                f"{type(module).__name__}: attention module has no layer_idx; cannot tell "
                "layers apart during capture")
        sc = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        _ACTIVE[-1](int(layer_idx), query.detach(), key.detach(), value.detach(),
                    out.detach(), sc)
    return out, weights


def register_capture_attention() -> str:
    """Register :data:`CAPTURE_ATTN_NAME` with transformers' attention and mask
    interfaces (idempotent) and return the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CAPTURE_ATTN_NAME, _capture_attention_forward)
    AttentionMaskInterface.register(CAPTURE_ATTN_NAME, sdpa_mask)
    return CAPTURE_ATTN_NAME


def _set_impl(model, name: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        try:
            setter(name)
        except (ValueError, ImportError, AttributeError) as exc:
            raise UnsupportedConfigError(
                f"{type(model).__name__}: cannot route attention through transformers' "
                f"AttentionInterface ({exc})") from exc
    # set it on every (sub)config that attention modules read, as set_attn_implementation
    # may not reach configs that are shared by reference
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            try:
                cfg._attn_implementation = name
            except (AttributeError, ValueError):
                pass


@contextlib.contextmanager
def capture_attention(model, observer: Observer) -> Iterator[None]:
    """Route ``model``'s attention through the capture function inside the block.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A decoder model whose attention layers call ``ALL_ATTENTION_FUNCTIONS``.
    observer : callable
        Called once per attention layer and forward pass as
        ``observer(layer_idx, query [B, Hq, T, D], key [B, H, T, D], value [B, H, T, D],
        attn_output [B, T, Hq, D], scaling)``; all tensors are post-RoPE and detached.

    Examples
    --------
    >>> seen = []
    >>> with capture_attention(model, lambda i, q, k, v, o, s: seen.append(i)):  # doctest: +SKIP
    ...     model(input_ids)
    """
    name = register_capture_attention()
    previous = getattr(model.config, "_attn_implementation", None) or "sdpa"
    _set_impl(model, name)
    _ACTIVE.append(observer)
    try:
        yield
    finally:
        _ACTIVE.pop()
        _set_impl(model, previous)


@dataclass(frozen=True)
class AttentionGeometry:
    """Attention shape of a decoder model, as the calibration needs it."""

    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    model_class: str

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    def fingerprint(self) -> ModelFingerprint:
        return ModelFingerprint(self.num_layers, self.num_kv_heads, self.num_qo_heads,
                                self.head_dim)


def _text_config(model):
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    return get() if get is not None else cfg


def attention_geometry(model) -> AttentionGeometry:
    """Read layers, heads and ``head_dim`` from the model's (text) config."""
    cfg = _text_config(model)
    cls = type(model).__name__
    try:
        num_layers = int(cfg.num_hidden_layers)
        hq = int(cfg.num_attention_heads)
    except (AttributeError, TypeError) as exc:
        raise UnsupportedConfigError(f"{cls}: config has no num_hidden_layers / "
                                     f"num_attention_heads ({exc})") from exc
    h = int(getattr(cfg, "num_key_value_heads", None) or hq)
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    return AttentionGeometry(num_layers, hq, h, int(d), cls)


def _has_rope(model) -> bool:
    cfg = _text_config(model)
    if any(getattr(cfg, a, None) is not None for a in ("rope_parameters", "rope_theta",
                                                       "rope_scaling")):
        return True
    return any("rotary" in type(m).__name__.lower() for m in model.modules())


def check_supported(model, *, probe: bool = True) -> AttentionGeometry:
    """Geometry of ``model``, or :class:`UnsupportedConfigError` naming its class.

    Checks: a rotary position embedding exists; ``head_dim`` is a power of two >= 16;
    ``num_qo_heads`` is a multiple of ``num_kv_heads``; and (``probe=True``) a 4-token
    forward pass calls the capture attention once in every layer with query/key shapes
    that match the config.
    """
    geo = attention_geometry(model)
    cls = geo.model_class
    if not _has_rope(model):
        raise UnsupportedConfigError(f"{cls}: no rotary position embedding (RoPE) found; "
                                     "calibration captures post-RoPE keys of RoPE models only")
    if not (is_power_of_two(geo.head_dim) and geo.head_dim >= 16):
        raise UnsupportedConfigError(f"{cls}: head_dim must be a power of two >= 16 for "
                                     f"the Hadamard rotation, got {geo.head_dim}")
    if geo.num_qo_heads % geo.num_kv_heads:
        raise UnsupportedConfigError(f"{cls}: num_attention_heads={geo.num_qo_heads} is not "
                                     f"a multiple of num_key_value_heads={geo.num_kv_heads}")
    if not probe:
        return geo
    calls: dict[int, tuple] = {}

    def obs(i, q, k, v, o, s):
        calls[i] = (tuple(q.shape), tuple(k.shape))

    device = next(model.parameters()).device
    ids = torch.arange(4, device=device)[None] + 1
    with torch.no_grad(), capture_attention(model, obs):
        model(input_ids=ids, use_cache=False)
    missing = [i for i in range(geo.num_layers) if i not in calls]
    if missing:
        raise UnsupportedConfigError(
            f"{cls}: attention of layers {missing[:8]}{'...' if len(missing) > 8 else ''} is "
            "not routed through transformers' AttentionInterface (config._attn_implementation); "
            "cannot capture post-RoPE Q/K/V")
    for i, (qs, ks) in calls.items():
        if qs[1] != geo.num_qo_heads or ks[1] != geo.num_kv_heads or qs[-1] != geo.head_dim:
            raise UnsupportedConfigError(
                f"{cls}: layer {i} attention got query {qs} / key {ks}; expected "
                f"[B, {geo.num_qo_heads}, T, {geo.head_dim}] / [B, {geo.num_kv_heads}, T, "
                f"{geo.head_dim}] from the config")
    return geo
