"""Format math: packing, quantization, clipping, constant groups, non-finite input."""

import math

import pytest
import torch

from oscar_kernels.reference.quant import (FP16_MAX, clip_groups, clip_index, dequantize_groups,
                                           pack_codes, quantize_groups, unpack_codes)


@pytest.mark.parametrize("d", [16, 64, 128])
def test_unpack_pack_exhaustive_all_bytes(d):
    # every byte value at every byte position of a row
    rows = torch.arange(256, dtype=torch.int64)[:, None].expand(256, d // 4)
    rows = ((rows + torch.arange(d // 4)[None, :] * 37) % 256).to(torch.uint8)
    codes = unpack_codes(rows)
    assert codes.shape == (256, d)
    assert int(codes.max()) <= 3
    assert torch.equal(pack_codes(codes), rows)
    # bit and channel order: byte j holds channel j + i*D/4 in bits [2i, 2i+2)
    for i in range(4):
        assert torch.equal(codes[:, i * d // 4:(i + 1) * d // 4],
                           ((rows.to(torch.int32) >> (2 * i)) & 3).to(torch.uint8))


def test_pack_unpack_random_codes(gen):
    codes = torch.randint(0, 4, (50, 3, 128), generator=gen, dtype=torch.uint8)
    assert torch.equal(unpack_codes(pack_codes(codes)), codes)


@pytest.mark.parametrize("d,g", [(64, 64), (64, 32), (128, 128), (128, 64), (128, 32)])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
def test_quantize_error_within_half_scale(gen, d, g, scale_dtype):
    x = torch.randn(300, 4, d, generator=gen) * 3 + torch.randn(300, 4, 1, generator=gen)
    codes, scale, zero = quantize_groups(x, g, 1.0, scale_dtype)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 3
    assert scale.dtype == scale_dtype and scale.shape == (300, 4, d // g)
    deq = dequantize_groups(codes, scale, zero, g)
    err = (deq - x).abs().reshape(300, 4, d // g, g).amax(-1)
    bound = scale.float() / 2 * (1 + 2e-3) + 1e-6
    assert bool((err <= bound).all()), float((err - bound).max())


def test_codes_use_all_levels_and_hit_extremes(gen):
    x = torch.randn(1000, 64, generator=gen)
    codes, scale, zero = quantize_groups(x, 64, 1.0, torch.float32)
    assert set(codes.unique().tolist()) == {0, 1, 2, 3}
    # min maps to 0 and max to 3 in every group
    assert bool((codes.gather(-1, x.argmin(-1, keepdim=True)) == 0).all())
    assert bool((codes.gather(-1, x.argmax(-1, keepdim=True)) == 3).all())


def test_clip_rule_exact(gen):
    g = 128
    x = torch.randn(64, g, generator=gen)
    for ratio in (0.96, 0.92, 0.5, 1.0):
        k = clip_index(ratio, g)
        assert k == min(g - 1, math.floor(ratio * g))
        tau = x.abs().sort(-1).values[:, k:k + 1]
        got = clip_groups(x, g, ratio)
        assert torch.equal(got, torch.maximum(torch.minimum(x, tau), -tau))
        # exactly the entries above tau in magnitude are clipped
        assert int((got.abs() < x.abs()).sum(-1).max()) <= g - 1 - k
    assert clip_index(0.96, 128) == 122 and clip_index(0.92, 64) == 58


def test_clip_is_per_group(gen):
    x = torch.randn(8, 128, generator=gen)
    x[:, :32] *= 100
    got = clip_groups(x, 32, 0.9)
    for j in range(4):
        assert torch.equal(got[:, 32 * j:32 * (j + 1)], clip_groups(x[:, 32 * j:32 * (j + 1)], 32, 0.9))


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, float("nan")])
def test_bad_clip_ratio(ratio):
    with pytest.raises(ValueError, match="clip ratio"):
        clip_index(ratio, 64)


def test_constant_group_no_nan():
    x = torch.full((3, 64), 1.25)
    x[1] = 0.0
    codes, scale, zero = quantize_groups(x, 64, 0.96)
    assert bool(torch.isfinite(scale).all()) and bool((scale == 0).all())
    assert bool((codes == 0).all())
    assert torch.equal(dequantize_groups(codes, scale, zero, 64), x)


def test_nonfinite_isolated_to_its_group(gen):
    x = torch.randn(6, 128, generator=gen)
    ref_codes, ref_scale, ref_zero = quantize_groups(x.clone(), 32, 0.96)
    x[2, 5] = float("nan")
    x[4, 100] = float("inf")
    codes, scale, zero = quantize_groups(x, 32, 0.96)
    bad = torch.zeros(6, 4, dtype=torch.bool)
    bad[2, 0] = bad[4, 3] = True
    assert bool(torch.isnan(scale[bad]).all()) and bool(torch.isnan(zero[bad]).all())
    assert torch.equal(scale[~bad], ref_scale[~bad]) and torch.equal(zero[~bad], ref_zero[~bad])
    cg, rg = codes.reshape(6, 4, 32), ref_codes.reshape(6, 4, 32)
    assert torch.equal(cg[~bad], rg[~bad])
    assert bool((cg[bad] == 0).all())


def test_fp16_scale_saturates_instead_of_overflowing():
    x = torch.zeros(1, 64)
    x[0, 0] = -1e6
    x[0, 1] = 1e6
    codes, scale, zero = quantize_groups(x, 64, 1.0, torch.float16)
    assert bool(torch.isfinite(scale).all()) and float(scale) == FP16_MAX
    assert float(zero) == -FP16_MAX


def test_quantize_rejects_non_fp32():
    with pytest.raises(TypeError, match="float32"):
        quantize_groups(torch.randn(2, 64).half(), 64)
    with pytest.raises(ValueError, match="group_size"):
        quantize_groups(torch.randn(2, 64), 48)
