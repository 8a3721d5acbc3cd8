"""Rotation building blocks: normalized Sylvester Hadamard, bit reversal, ``U · H · P_br``.

All functions return float32 tensors on the CPU unless a device is given; the math is
done in float64 first so the results are orthogonal to float32 precision.
"""

from __future__ import annotations

import torch

from ..errors import expect
from ..spec import is_power_of_two


def hadamard(n: int, *, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Normalized Sylvester Hadamard matrix ``H_n`` with ``H_n @ H_n.T = I``.

    ``H_1 = [1]``, ``H_2n = [[H_n, H_n], [H_n, -H_n]] / sqrt(2)``; entry ``(i, j)`` is
    ``(-1) ** popcount(i & j) / sqrt(n)``. ``n`` must be a power of two.
    """
    expect(is_power_of_two(n), "n", "a power of two", n)
    idx = torch.arange(n, dtype=torch.int64)
    bits = idx[:, None] & idx[None, :]
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    h = (1.0 - 2.0 * parity.to(torch.float64)) / (n ** 0.5)
    return h.to(dtype=dtype, device=device)


def bit_reversal_permutation(n: int) -> torch.Tensor:
    """``perm[i]`` = ``i`` with its ``log2(n)`` bits reversed (an involution)."""
    expect(is_power_of_two(n), "n", "a power of two", n)
    nbits = n.bit_length() - 1
    perm = [int(format(i, f"0{nbits}b")[::-1], 2) if nbits else 0 for i in range(n)]
    return torch.tensor(perm, dtype=torch.int64)


def bit_reversal_matrix(n: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Permutation matrix ``P_br`` with ``P[i, br(i)] = 1`` (symmetric: ``P = P.T = P^-1``)."""
    p = torch.zeros(n, n, dtype=dtype)
    p[torch.arange(n), bit_reversal_permutation(n)] = 1
    return p


def sort_eigenbasis(eigenvalues: torch.Tensor, eigenvectors: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Order eigenpairs by descending eigenvalue (columns of ``eigenvectors``)."""
    order = torch.argsort(eigenvalues, descending=True, stable=True)
    return eigenvalues[..., order], eigenvectors[..., :, order]


def compose_rotation(eigenvectors: torch.Tensor, eigenvalues: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """``R = U · H · P_br`` for one ``[D, D]`` eigenbasis ``U`` (columns = eigenvectors).

    When ``eigenvalues`` is given, ``U``'s columns are first sorted by descending
    eigenvalue. Since ``P H P = H`` for the Sylvester matrix, ``U H P = (U P) H``: the
    eigen-direction of rank ``i`` lands at bit-reversed position ``br(i)`` before the
    Hadamard mixes channels. Rows are the input channels: a row vector ``x`` is rotated
    as ``x @ R``. Returned in float32; computed in float64.
    """
    d = eigenvectors.shape[-1]
    expect(eigenvectors.shape == (d, d), "eigenvectors", "a square [D, D] matrix", eigenvectors)
    u = eigenvectors.to(torch.float64)
    if eigenvalues is not None:
        _, u = sort_eigenbasis(eigenvalues.to(torch.float64), u)
    r = (u @ hadamard(d, dtype=torch.float64))[:, bit_reversal_permutation(d)]
    return r.to(torch.float32)


def hadamard_rotation(d: int) -> torch.Tensor:
    """The calibration-free rotation ``H · P_br`` (``U = I``), float32."""
    return compose_rotation(torch.eye(d, dtype=torch.float64))


def orthogonality_error(r: torch.Tensor) -> float:
    """``max |R R^T - I|`` over all heads, computed in float64."""
    r64 = r.to(torch.float64)
    eye = torch.eye(r.shape[-1], dtype=torch.float64)
    return float((r64 @ r64.transpose(-1, -2) - eye).abs().max())
