"""Fitted artifacts are valid, round-trip through the file format, load into the
reference decode path; the attention-error measure agrees with an independent oracle;
the clip search finds the grid minimum."""

from __future__ import annotations

import pytest
import torch

from calib_models import tiny_model
from helpers import i32, make_page_table, oracle_attention, poisoned_cache, rel_err
from oscar_kernels import CacheSpec, ops
from oscar_kernels.calibration.attn_error import (CLIP_GRID, LayerEvaluator, QuantRule,
                                                  _grid_min, sample_query_positions)
from oscar_kernels.calibration.capture import check_supported
from oscar_kernels.calibration.fit import METHODS, fit_artifact
from oscar_kernels.calibration.pipeline import collect_heldout, collect_statistics
from oscar_kernels.reference.rotation_math import hadamard_rotation, orthogonality_error
from oscar_kernels.rotation import RotationArtifact


@pytest.fixture(scope="module")
def calibrated():
    model = tiny_model("llama", seed=4)
    geo = check_supported(model)
    gen = torch.Generator().manual_seed(8)
    ids = torch.randint(3, model.config.vocab_size, (700,), generator=gen)
    stats = collect_statistics(model, geo, ids[:500], max_tokens=500, chunk_len=128,
                               progress=False)
    held = collect_heldout(model, geo, ids[500:], seq_len=200, num_sequences=1,
                           queries_per_sequence=12, min_query_position=40)
    return model, geo, stats, held


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("per_head", [False, True])
def test_fitted_artifact_round_trip(calibrated, method, per_head, tmp_path):
    _, geo, stats, _ = calibrated
    art = fit_artifact(stats, geo.fingerprint(), method, per_head=per_head,
                       k_clip=[0.9, 0.96], v_clip=0.92, provenance={"test": 1})
    fitted = method not in ("identity", "hadamard")
    hr = geo.num_kv_heads if (per_head and fitted) else 1
    for lr in art.layers:
        assert lr.rot_k.shape == (hr, 16, 16) and lr.rot_k.dtype == torch.float32
        assert orthogonality_error(lr.rot_k) < 1e-5 and orthogonality_error(lr.rot_v) < 1e-5
        if fitted:
            ev = lr.k_eigenvalues
            assert ev.shape == (hr, 16) and bool((ev[:, :-1] >= ev[:, 1:]).all())
    if method == "hadamard":
        torch.testing.assert_close(art.layers[0].rot_k[0], hadamard_rotation(16))
    path = tmp_path / f"{method}.safetensors"
    art.save(path)
    back = RotationArtifact.load(path)
    assert back.method == method and back.fingerprint == geo.fingerprint()
    assert [lr.k_clip for lr in back.layers] == [0.9, 0.96]
    for a, b in zip(art.layers, back.layers):
        assert torch.equal(a.rot_k, b.rot_k) and torch.equal(a.rot_v, b.rot_v)


def test_oscar_key_rotation_diagonalizes_query_covariance(calibrated):
    """R = U H P_br: R_K P_br H^T = U, whose columns diagonalize C_Q (descending)."""
    _, geo, stats, _ = calibrated
    art = fit_artifact(stats, geo.fingerprint(), "oscar", per_head=True)
    c_q = stats[0].covariances()["c_q"]
    for h in range(geo.num_kv_heads):
        r = art.layers[0].rot_k[h].double()
        u = r @ hadamard_rotation(16).double().T          # (U H P)(H P)^T = U
        lam = u.T @ c_q[h] @ u
        off = lam - torch.diag(torch.diagonal(lam))
        assert float(off.abs().max()) < 1e-4 * float(lam.abs().max())
        d = torch.diagonal(lam)
        assert bool((d[:-1] >= d[1:] - 1e-6 * d.abs().max()).all())


@pytest.mark.parametrize("method", ["oscar", "kv-cov"])
def test_artifact_loads_into_reference_decode(calibrated, method, tmp_path):
    """The saved artifact drives ops.quantize_append + ops.paged_decode_attention
    (backend="reference") on the model's real K/V; the result equals the independent
    float64 oracle on the same quantized sequence."""
    _, geo, stats, held = calibrated
    path = tmp_path / "a.safetensors"
    fit_artifact(stats, geo.fingerprint(), method, per_head=True).save(path)
    art = RotationArtifact.load(path)
    gen = torch.Generator().manual_seed(3)
    spec = CacheSpec(num_kv_heads=geo.num_kv_heads, head_dim=geo.head_dim, page_size=16,
                     group_size=8, sink_size=4, recent_size=16)
    for layer in range(geo.num_layers):
        seq = held[layer][0]
        n = int(seq.q_positions[-1]) + 1
        k, v = seq.k[:n], seq.v[:n]
        kv_indptr, kv_indices, kv_last, num_pages = make_page_table([n], 16, gen)
        cache = poisoned_cache(spec, num_pages, 1)
        rot = art.layer(layer)
        ops.quantize_append_paged_kv_cache(k, v, i32([0] * n), i32(list(range(n))), cache,
                                           kv_indices, kv_indptr, kv_last, i32([0]), rot,
                                           backend="reference")
        q = seq.q[-1:]
        out = ops.paged_decode_attention(q, cache, kv_indptr, kv_indices, kv_last, i32([0]),
                                         rot, sm_scale=seq.scaling, backend="reference")
        want = oracle_attention(q, k, v, rot, spec, [n - 1], sm_scale=seq.scaling)
        assert bool(torch.isfinite(out).all())
        assert rel_err(out, want) < 2e-5


def test_layer_error_matches_oracle(calibrated):
    """LayerEvaluator (window_rule_attention + reference quantizer) equals the float64
    oracle of tests/helpers.py on the same held-out tensors."""
    _, geo, stats, held = calibrated
    art = fit_artifact(stats, geo.fingerprint(), "oscar", per_head=True)
    rule = QuantRule(group_size=8, sink_size=4, recent_size=16)
    spec = CacheSpec(num_kv_heads=geo.num_kv_heads, head_dim=geo.head_dim, page_size=1,
                     group_size=8, sink_size=4, recent_size=16)
    seq = held[1][0]
    ev = LayerEvaluator([seq], rule)
    for k_clip, v_clip in ((1.0, 1.0), (0.9, 0.84)):
        lr = art.layer(1)
        got = ev.error(lr.rot_k, lr.rot_v, k_clip, v_clip)
        from oscar_kernels.rotation import LayerRotation
        rot = LayerRotation(lr.rot_k, lr.rot_v, k_clip, v_clip)
        o = oracle_attention(seq.q, seq.k, seq.v, rot, spec, seq.q_positions.tolist(),
                             sm_scale=seq.scaling)
        want = rel_err(o, ev.refs[0])
        assert got == pytest.approx(want, rel=1e-3)
        assert got > 1e-3                                   # INT2 error is visible


def test_unquantized_error_is_bf16_rounding_only(calibrated):
    _, geo, _, held = calibrated
    eye = torch.eye(geo.head_dim)[None]
    ev = LayerEvaluator(held[0], QuantRule(sink_size=4, recent_size=16))
    assert ev.error(eye, eye, None, None) < 1e-2
    assert ev.error(eye, eye, 1.0, 1.0) > 10 * ev.error(eye, eye, None, None)


@pytest.mark.parametrize("best", [0, 3, 6, 9, 10])
def test_grid_min_finds_unimodal_minimum(best):
    grid = sorted(CLIP_GRID, reverse=True)
    calls = []

    def f(c):
        calls.append(c)
        return (grid.index(c) - best) ** 2 + 0.1 * grid.index(c)

    assert _grid_min(f, CLIP_GRID) == grid[best]
    assert len(calls) < len(grid)


def test_sample_query_positions():
    pos = sample_query_positions(2048, 64, 512)
    assert pos.numel() == 64 and int(pos[0]) == 512 and int(pos[-1]) == 2047
    assert bool((pos[1:] > pos[:-1]).all())
    assert sample_query_positions(10, 64, 512).tolist() == [9]


def test_fast_clip_search_errors_equal_general_path(calibrated):
    """The search's one-einsum-per-ratio errors equal LayerEvaluator.error (which runs
    window_rule_attention), so the search minimizes the reported quantity."""
    _, geo, stats, held = calibrated
    art = fit_artifact(stats, geo.fingerprint(), "oscar", per_head=True)
    lr = art.layer(0)
    ev = LayerEvaluator(held[0], QuantRule(group_size=8, sink_size=4, recent_size=16))
    for c in (1.0, 0.9, 0.82):
        assert ev._k_search_error(lr.rot_k, lr.rot_v, c) == pytest.approx(
            ev.error(lr.rot_k, lr.rot_v, c, None), rel=1e-4)
    v_errs = ev._v_search_errors(lr.rot_k, lr.rot_v, 0.9, CLIP_GRID)
    for c in (1.0, 0.86, 0.8):
        assert v_errs[c] == pytest.approx(ev.error(lr.rot_k, lr.rot_v, 0.9, c), rel=1e-4)
    kc, vc = ev.search_clip(lr.rot_k, lr.rot_v)
    brute_k = min(CLIP_GRID, key=lambda c: (ev.error(lr.rot_k, lr.rot_v, c, None), -c))
    assert kc in CLIP_GRID and vc == min(v_errs_k := ev._v_search_errors(
        lr.rot_k, lr.rot_v, kc, CLIP_GRID), key=lambda c: (v_errs_k[c], -c))
    # the K search's minimum is the grid minimum or within 1% of it (unimodal shortcut)
    assert ev.error(lr.rot_k, lr.rot_v, kc, None) <= 1.01 * ev.error(lr.rot_k, lr.rot_v,
                                                                     brute_k, None)


@pytest.mark.parametrize("group_size", [4, 16, 64])
def test_group_fake_quantizer_is_bit_identical_to_reference(group_size):
    from oscar_kernels.calibration.attn_error import GroupFakeQuantizer, fake_quantize

    gen = torch.Generator().manual_seed(group_size)
    x = torch.randn(97, 3, 64, generator=gen) * torch.linspace(0.01, 5, 64)
    x[5, 1, :group_size] = 0.25                                   # a constant group
    x[7, 0] *= 1e6                                                # saturates fp16 scale
    fq = GroupFakeQuantizer(x, group_size)
    for ratio in CLIP_GRID + (0.5, 0.97):
        assert torch.equal(fq(ratio), fake_quantize(x, group_size, ratio)), ratio


def test_clip_grid_bounds_and_errors():
    from oscar_kernels.calibration.attn_error import clip_grid

    assert clip_grid(0.8) == CLIP_GRID
    assert clip_grid(1.0) == (1.0,)
    g = clip_grid(0.9)
    assert g == (0.9, 0.92, 0.94, 0.96, 0.98, 1.0)
    assert clip_grid(0.91) == (0.91, 0.92, 0.94, 0.96, 0.98, 1.0)
    for bad in (0.0, 1.2, -0.5):
        with pytest.raises(ValueError, match="lowest"):
            clip_grid(bad)
