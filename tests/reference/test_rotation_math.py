"""Hadamard, bit reversal and U·H·P_br composition."""

import pytest
import torch

from oscar_kernels.reference.rotation_math import (bit_reversal_matrix, bit_reversal_permutation,
                                                   compose_rotation, hadamard, hadamard_rotation,
                                                   orthogonality_error)


@pytest.mark.parametrize("n", [1, 2, 16, 64, 128, 256])
def test_hadamard_orthogonal_and_sylvester(n):
    h = hadamard(n, dtype=torch.float64)
    assert orthogonality_error(h) < 1e-12
    assert torch.allclose(h.abs(), torch.full_like(h, n ** -0.5))
    if n >= 2:
        half = hadamard(n // 2, dtype=torch.float64)
        top = torch.cat([half, half], 1)
        bot = torch.cat([half, -half], 1)
        assert torch.allclose(h, torch.cat([top, bot], 0) / 2 ** 0.5)


def test_bit_reversal():
    assert bit_reversal_permutation(8).tolist() == [0, 4, 2, 6, 1, 5, 3, 7]
    for n in (16, 64, 128):
        p = bit_reversal_permutation(n)
        assert torch.equal(p[p], torch.arange(n))  # involution
        pm = bit_reversal_matrix(n)
        assert torch.equal(pm, pm.T)


@pytest.mark.parametrize("n", [64, 128])
def test_compose_rotation(n, gen):
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    evals, evecs = torch.linalg.eigh(a @ a.T)
    r = compose_rotation(evecs, evals)
    assert r.dtype == torch.float32
    assert orthogonality_error(r) < 1e-5
    order = torch.argsort(evals, descending=True)
    u = evecs[:, order]
    h = hadamard(n, dtype=torch.float64)
    p = bit_reversal_matrix(n, dtype=torch.float64)
    assert torch.allclose(r.double(), u @ h @ p, atol=1e-6)
    assert torch.allclose(u @ h @ p, u @ p @ h, atol=1e-12)  # P H P = H
    # the top eigen-direction maps onto a flat Hadamard row: energy spread over all channels
    assert torch.allclose((u[:, 0] @ r.double()).abs(), torch.full((n,), n ** -0.5, dtype=torch.float64), atol=1e-5)


def test_hadamard_rotation_is_h_times_p():
    r = hadamard_rotation(64)
    assert torch.allclose(r.double(), hadamard(64, dtype=torch.float64)
                          @ bit_reversal_matrix(64, dtype=torch.float64), atol=1e-7)


def test_bad_sizes():
    with pytest.raises(ValueError, match="power of two"):
        hadamard(48)
    with pytest.raises(ValueError, match="power of two"):
        bit_reversal_permutation(12)
