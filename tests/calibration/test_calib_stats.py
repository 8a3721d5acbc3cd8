"""Streaming statistics: chunked accumulation equals one shot; exact C_S equals the
brute-force ``Vᵀ SᵀS V`` with the model's real softmax scores."""

from __future__ import annotations

import pytest
import torch

from calib_models import tiny_model
from oscar_kernels.calibration.capture import capture_attention
from oscar_kernels.calibration.stats import LayerStats, score_weighted_covariance


def _random_chunk(t, h, g, d, gen):
    q = torch.randn(t, h * g, d, generator=gen) * 2.0
    k = torch.randn(t, h, d, generator=gen) + torch.linspace(-1, 3, d)
    v = torch.randn(t, h, d, generator=gen) * torch.linspace(0.2, 2, d)
    o = torch.randn(t, h * g, d, generator=gen)
    return q, k, v, o


@pytest.mark.parametrize("h,g,d", [(2, 2, 16), (3, 3, 64), (1, 4, 32)])
def test_chunked_accumulation_equals_one_shot(h, g, d):
    gen = torch.Generator().manual_seed(11)
    q, k, v, o = _random_chunk(301, h, g, d, gen)
    one = LayerStats(h, h * g, d)
    one.update(q, k, v, o)
    chunked = LayerStats(h, h * g, d)
    for s, e in ((0, 1), (1, 64), (64, 200), (200, 301)):       # uneven chunks
        chunked.update(q[s:e], k[s:e], v[s:e], o[s:e])
    assert chunked.num_tokens == one.num_tokens == 301
    a, b = chunked.covariances(), one.covariances()
    for name in ("c_q", "c_k", "c_v", "c_s"):
        torch.testing.assert_close(a[name], b[name], rtol=1e-12, atol=1e-12)
    # explicit formulas
    q64 = q.double().reshape(301, h, g, d)
    c_q = torch.einsum("thgd,thge->hde", q64, q64) / (301 * g)
    torch.testing.assert_close(b["c_q"], c_q, rtol=1e-12, atol=1e-12)
    c_v = torch.einsum("thd,the->hde", v.double(), v.double()) / 301
    torch.testing.assert_close(b["c_v"], c_v, rtol=1e-12, atol=1e-12)
    # proxy of the one-shot pass: w_t = k_t C_Q k_t^T normalized to mean 1
    w = torch.einsum("thd,hde,the->th", k.double(), c_q, k.double())
    w = w / w.mean(dim=0, keepdim=True)
    proxy = torch.einsum("th,thd,the->hde", w, v.double(), v.double()) / 301
    torch.testing.assert_close(b["c_s_proxy"], proxy, rtol=1e-10, atol=1e-12)
    # per-layer targets are the mean over KV heads
    pl = one.covariances(per_head=False)
    torch.testing.assert_close(pl["c_k"][0], b["c_k"].mean(0), rtol=1e-12, atol=1e-12)


def test_memory_is_fixed_by_shape():
    gen = torch.Generator().manual_seed(5)
    st = LayerStats(2, 4, 16)
    sizes = {k: v.numel() for k, v in st.state_dict().items() if torch.is_tensor(v)}
    for _ in range(5):
        st.update(*_random_chunk(128, 2, 2, 16, gen))
    assert {k: v.numel() for k, v in st.state_dict().items() if torch.is_tensor(v)} == sizes


def _brute_cs(q, k, v, scaling):
    """``Σ_j Vᵀ S_jᵀ S_j V`` with the full causal softmax matrix of each query head."""
    t, hq, d = q.shape
    h = k.shape[1]
    g = hq // h
    out = torch.zeros(h, d, d, dtype=torch.float64)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    for j in range(hq):
        kv = j // g
        s = (q[:, j].double() @ k[:, kv].double().T) * scaling
        p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)         # [T, T]
        vv = v[:, kv].double()
        out[kv] += vv.T @ p.T @ p @ vv
    return out


@pytest.mark.parametrize("block_size", [1, 7, 64, 1000])
def test_blockwise_score_weighted_covariance_equals_brute_force(block_size):
    gen = torch.Generator().manual_seed(21)
    q, k, v, _ = _random_chunk(53, 2, 3, 16, gen)
    got = score_weighted_covariance(q, k, v, 0.25, block_size=block_size)
    torch.testing.assert_close(got, _brute_cs(q, k, v, 0.25), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_exact_cs_from_model_equals_brute_force(family):
    """The C_S accumulated from the model's real attention output (two chunks) equals
    ``Vᵀ SᵀS V`` recomputed from the captured q, k, v with full score matrices."""
    model = tiny_model(family, seed=9)
    cfg = model.config
    h, hq, d = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim
    stats = [LayerStats(h, hq, d) for _ in range(cfg.num_hidden_layers)]
    brute = [torch.zeros(h, d, d, dtype=torch.float64) for _ in stats]
    count = [0]

    def obs(i, q, k, v, o, scaling):
        t = q.shape[2]
        qt, kt, vt = (x[0].transpose(0, 1) for x in (q, k, v))
        stats[i].update(qt, kt, vt, o[0])
        brute[i] += _brute_cs(qt, kt, vt, scaling)
        if i == 0:
            count[0] += t

    gen = torch.Generator().manual_seed(2)
    with torch.no_grad(), capture_attention(model, obs):
        for t in (40, 23):
            model(input_ids=torch.randint(3, cfg.vocab_size, (1, t), generator=gen),
                  use_cache=False)
    assert count[0] == 63
    for st, b in zip(stats, brute):
        c_s = st.covariances()["c_s"]
        torch.testing.assert_close(c_s, b / (63 * (hq // h)), rtol=1e-4, atol=1e-6)
        assert float(c_s.abs().max()) > 1e-3            # non-trivial
