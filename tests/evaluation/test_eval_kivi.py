"""KIVI-2 emulation: block/token quantization bounds, exact residual, read masks, bits."""

import math

import pytest
import torch

from oscar_kernels.evaluation.kivi import (KiviLayerRule, kivi_bits, kivi_full_masks,
                                            kivi_quantize_keys, kivi_quantize_values)


def test_keys_per_channel_blocks_within_half_a_scale(gen):
    k = torch.randn(101, 3, 16, generator=gen) * 3
    k_hat, scale, n = kivi_quantize_keys(k, 32)
    assert n == 96 and scale.shape == (3, 3, 16)
    # the trailing partial block is never read quantized and stays exact
    assert torch.equal(k_hat[n:], k[n:])
    err = (k_hat[:n] - k[:n]).abs().reshape(3, 32, 3, 16)
    bound = scale.float()[:, None] / 2 * (1 + 1e-3) + 1e-3  # fp16 rounding of scale/zero
    assert bool((err <= bound).all())
    # per channel over tokens: a block whose one channel is shifted changes only it
    k2 = k.clone()
    k2[:32, 1, 5] += 100.0
    k2_hat, _, _ = kivi_quantize_keys(k2, 32)
    same = torch.ones_like(k_hat, dtype=torch.bool)
    same[:32, 1, 5] = False
    assert torch.equal(k2_hat[same], k_hat[same])


def test_values_per_token_within_half_a_scale(gen):
    v = torch.randn(40, 2, 64, generator=gen)
    v_hat, scale = kivi_quantize_values(v, 32)
    assert scale.shape == (40, 2, 2)
    err = (v_hat - v).abs().reshape(40, 2, 2, 32)
    assert bool((err <= scale.float()[..., None] / 2 * (1 + 1e-3) + 1e-3).all())


def test_masks_follow_kivi_decoding():
    r = 8
    t = torch.arange(40)
    visible, k_full, v_full = kivi_full_masks(t, 40, r)
    # keys: the residual holds 1..R tokens, flushed when it reaches R
    assert k_full.sum(1).tolist() == [(i % r) + 1 for i in range(40)]
    # values: a sliding residual of R + 1 tokens (append, attend, then quantize the oldest)
    assert v_full.sum(1).tolist() == [min(i + 1, r + 1) for i in range(40)]
    assert not bool((k_full & ~visible).any()) and not bool((v_full & ~visible).any())


def _oracle(q, k, v, pos, rule, scale):
    """Per-query float64 loop over the KIVI reads."""
    k_hat, _, _ = kivi_quantize_keys(k, rule.group_size)
    v_hat, _ = kivi_quantize_values(v, rule.group_size)
    k16, v16 = k.half().double(), v.half().double()
    h = k.shape[1]
    g = q.shape[1] // h
    out = torch.zeros(q.shape, dtype=torch.float64)
    r = rule.residual_length
    for i, t in enumerate(pos.tolist()):
        for head in range(q.shape[1]):
            kv = head // g
            ks = torch.stack([(k16 if p >= (t // r) * r else k_hat.double())[p, kv]
                              for p in range(t + 1)])
            vs = torch.stack([(v16 if p >= t - r else v_hat.double())[p, kv]
                              for p in range(t + 1)])
            w = torch.softmax(ks @ q[i, head].double() * scale, 0)
            out[i, head] = w @ vs
    return out


@pytest.mark.parametrize("lo,hi", [(0, 7), (0, 50), (30, 70)])
def test_emulation_matches_per_query_oracle(lo, hi, gen):
    rule = KiviLayerRule(group_size=4, residual_length=8, query_chunk=9)
    k = torch.randn(hi, 2, 8, generator=gen)
    v = torch.randn(hi, 2, 8, generator=gen)
    q = torch.randn(hi - lo, 4, 8, generator=gen)
    pos = torch.arange(lo, hi)
    got = rule.emulate(q, k, v, pos, 0.3)
    want = _oracle(q, k, v, pos, rule, 0.3)
    assert float((got.double() - want).abs().max()) < 1e-4


def test_residual_is_exact_before_the_first_flush(gen):
    rule = KiviLayerRule(group_size=4, residual_length=16)
    k = torch.randn(16, 2, 8, generator=gen)
    v = torch.randn(16, 2, 8, generator=gen)
    q = torch.randn(16, 2, 8, generator=gen)
    got = rule.emulate(q, k, v, torch.arange(16), 0.35)
    s = torch.einsum("qhd,lhd->hql", q, k.half().float()) * 0.35
    s = s.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("hql,lhd->qhd", torch.softmax(s, -1), v.half().float())
    assert float((got - want).abs().max()) < 1e-5


def test_bits_are_counted_honestly():
    assert kivi_bits() == 3.0          # 2-bit codes + fp16 scale and zero per 32 elements
    assert kivi_bits(group_size=64) == 2.5
    length = 2048
    qk, qv = 2048, 2048 - 128
    want = ((qk + qv) * 3.0 + (2 * length - qk - qv) * 16) / (2 * length)
    assert math.isclose(kivi_bits(length), want)
    assert kivi_bits(100) == 16.0      # everything still in the residual


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="residual_length"):
        KiviLayerRule(group_size=32, residual_length=100)
    with pytest.raises(TypeError, match="k"):
        kivi_quantize_keys(torch.zeros(4, 1, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="seq_len"):
        kivi_bits(0)
