"""Capture through transformers' attention interface: post-RoPE Q/K/V and the output are
exactly what a manual RoPE of the projections gives; unsupported models fail clearly."""

from __future__ import annotations

import pytest
import torch

from calib_models import tiny_model
from oscar_kernels.calibration.capture import capture_attention, check_supported
from oscar_kernels.errors import UnsupportedConfigError


def _rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def _manual_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """``x [B, H, T, D]`` rotated with the half-split (GPT-NeoX) RoPE, computed in float64."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x64 = x.to(torch.float64)
    rot_half = torch.cat([-x64[..., d // 2:], x64[..., : d // 2]], dim=-1)
    return x64 * cos + rot_half * sin


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_captured_qkv_match_manual_rope(family):
    model = tiny_model(family, seed=3)
    cfg = model.config
    h, hq, d = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim
    t = 37
    ids = torch.randint(3, cfg.vocab_size, (1, t), generator=torch.Generator().manual_seed(7))
    hidden = {}

    def pre_hook(mod, args, kwargs):
        hidden[mod.layer_idx] = kwargs.get("hidden_states", args[0] if args else None).detach()

    handles = [layer.self_attn.register_forward_pre_hook(pre_hook, with_kwargs=True)
               for layer in model.model.layers]
    captured = {}

    def obs(i, q, k, v, o, scaling):
        captured[i] = (q.clone(), k.clone(), v.clone(), o.clone(), scaling)

    # poison: nothing captured before the forward
    with torch.no_grad(), capture_attention(model, obs):
        logits_capture = model(input_ids=ids, use_cache=False).logits
    for hd in handles:
        hd.remove()
    with torch.no_grad():
        logits_plain = model(input_ids=ids, use_cache=False).logits
    # the capture function returns the real attention: the forward is unchanged
    torch.testing.assert_close(logits_capture, logits_plain, rtol=1e-5, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"      # restored
    assert sorted(captured) == list(range(cfg.num_hidden_layers))
    theta = _rope_theta(cfg)
    pos = torch.arange(t)
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        x = hidden[i]
        q = attn.q_proj(x).view(1, t, hq, d)
        k = attn.k_proj(x).view(1, t, h, d)
        v = attn.v_proj(x).view(1, t, h, d)
        if hasattr(attn, "q_norm"):                           # Qwen3: per-head RMSNorm
            q, k = attn.q_norm(q), attn.k_norm(k)
        q_ref = _manual_rope(q.transpose(1, 2), pos, theta)
        k_ref = _manual_rope(k.transpose(1, 2), pos, theta)
        cq, ck, cv, co, scaling = captured[i]
        assert cq.shape == (1, hq, t, d) and ck.shape == (1, h, t, d)   # GQA: un-repeated
        torch.testing.assert_close(cq.double(), q_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ck.double(), k_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cv, v.transpose(1, 2), rtol=1e-5, atol=1e-5)
        assert scaling == pytest.approx(d ** -0.5)
        # the output handed over is causal softmax attention of the captured tensors
        g = hq // h
        kr = ck.double().repeat_interleave(g, 1)
        vr = cv.double().repeat_interleave(g, 1)
        s = torch.einsum("bhqd,bhkd->bhqk", cq.double(), kr) * scaling
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        o_ref = torch.einsum("bhqk,bhkd->bqhd", torch.softmax(s, -1), vr)
        torch.testing.assert_close(co.double(), o_ref, rtol=1e-4, atol=1e-4)


def test_check_supported_reads_geometry():
    geo = check_supported(tiny_model("llama"))
    assert (geo.num_layers, geo.num_qo_heads, geo.num_kv_heads, geo.head_dim) == (2, 4, 2, 16)
    assert geo.model_class == "LlamaForCausalLM"


def test_head_dim_not_power_of_two_is_unsupported():
    model = tiny_model("qwen2", head_dim=24)
    with pytest.raises(UnsupportedConfigError, match="Qwen2ForCausalLM.*head_dim"):
        check_supported(model)


def test_no_rope_is_unsupported():
    import transformers

    cfg = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=50)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with pytest.raises(UnsupportedConfigError, match="GPT2LMHeadModel.*RoPE"):
        check_supported(model)


def test_attention_not_routed_through_interface_is_unsupported():
    model = tiny_model("llama")
    attn = model.model.layers[1].self_attn
    original = attn.forward

    def bypass(hidden_states, position_embeddings=None, attention_mask=None, **kw):
        # a layer that computes attention itself (here: eager) instead of the interface
        from transformers.models.llama.modeling_llama import eager_attention_forward
        b, t, _ = hidden_states.shape
        shp = (b, t, -1, attn.head_dim)
        q = attn.q_proj(hidden_states).view(shp).transpose(1, 2)
        k = attn.k_proj(hidden_states).view(shp).transpose(1, 2)
        v = attn.v_proj(hidden_states).view(shp).transpose(1, 2)
        o, w = eager_attention_forward(attn, q, k, v, None, scaling=attn.scaling)
        return attn.o_proj(o.reshape(b, t, -1)), w

    attn.forward = bypass
    try:
        with pytest.raises(UnsupportedConfigError, match=r"LlamaForCausalLM.*layers \[1\]"):
            check_supported(model)
    finally:
        attn.forward = original
