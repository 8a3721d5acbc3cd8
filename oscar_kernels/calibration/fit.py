"""Fit rotation artifacts from calibration statistics: OSCAR and the baselines.

Every fitted rotation is ``R = U · H · P_br``
(:func:`oscar_kernels.reference.rotation_math.compose_rotation`): ``U`` the eigenbasis of
a target covariance (``torch.linalg.eigh`` in float64, columns sorted by descending
eigenvalue), ``H`` the normalized Sylvester Hadamard matrix, ``P_br`` the bit-reversal
permutation; stored in float32. Methods:

============  ===========================  ================================
method        key target                   value target
============  ===========================  ================================
identity      (none: ``R = I``, naive)     (none)
hadamard      (none: ``R = H · P_br``)     (none)
kv-cov        ``KᵀK / N``                  ``VᵀV / N``
oscar         ``C_Q`` (query second        ``C_S`` exact (score-weighted,
              moment of the group)         from the real softmax scores)
oscar-proxy   ``C_Q``                      ``C_S`` proxy (``w_t = k C_Q kᵀ``)
============  ===========================  ================================
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import expect
from ..reference.rotation_math import compose_rotation, hadamard_rotation
from ..rotation import LayerRotation, ModelFingerprint, RotationArtifact
from ..spec import DEFAULT_K_CLIP, DEFAULT_V_CLIP
from .stats import LayerStats

METHODS = ("identity", "hadamard", "kv-cov", "oscar", "oscar-proxy")
TARGETS = {"kv-cov": ("c_k", "c_v"), "oscar": ("c_q", "c_s"), "oscar-proxy": ("c_q", "c_s_proxy")}


def eigen_rotation(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[Hr, D, D]`` symmetric PSD covariances → rotations ``[Hr, D, D]`` float32 and
    eigenvalues ``[Hr, D]`` float32 (descending)."""
    expect(cov.dim() == 3 and cov.shape[-1] == cov.shape[-2], "cov", "[Hr, D, D]", cov)
    c = cov.to(torch.float64)
    c = 0.5 * (c + c.transpose(-1, -2))
    evals, evecs = torch.linalg.eigh(c)
    rots, vals = [], []
    for h in range(c.shape[0]):
        rots.append(compose_rotation(evecs[h], evals[h]))
        vals.append(torch.sort(evals[h], descending=True).values.to(torch.float32))
    return torch.stack(rots), torch.stack(vals)


def fit_layer(stats: LayerStats, method: str, *, per_head: bool = False,
              k_clip: float = DEFAULT_K_CLIP, v_clip: float = DEFAULT_V_CLIP) -> LayerRotation:
    """One layer's :class:`LayerRotation` for ``method`` (see the module table)."""
    expect(method in METHODS, "method", f"one of {METHODS}", method)
    d = stats.head_dim
    if method == "identity":
        eye = torch.eye(d, dtype=torch.float32)[None]
        return LayerRotation(eye, eye.clone(), k_clip, v_clip)
    if method == "hadamard":
        h = hadamard_rotation(d)[None]
        return LayerRotation(h, h.clone(), k_clip, v_clip)
    covs = stats.covariances(per_head=per_head)
    kt, vt = TARGETS[method]
    rk, ek = eigen_rotation(covs[kt])
    rv, ev = eigen_rotation(covs[vt])
    return LayerRotation(rk, rv, k_clip, v_clip, ek, ev)


def fit_artifact(stats: Sequence[LayerStats], fingerprint: ModelFingerprint, method: str, *,
                 per_head: bool = False, k_clip: float | Sequence[float] = DEFAULT_K_CLIP,
                 v_clip: float | Sequence[float] = DEFAULT_V_CLIP,
                 provenance: dict | None = None) -> RotationArtifact:
    """A validated :class:`RotationArtifact` for all layers.

    ``k_clip`` / ``v_clip`` are one ratio for every layer or one per layer.
    """
    n = fingerprint.num_layers
    expect(len(stats) == n, "stats", f"{n} layers", len(stats))
    kc = [float(k_clip)] * n if isinstance(k_clip, (int, float)) else [float(c) for c in k_clip]
    vc = [float(v_clip)] * n if isinstance(v_clip, (int, float)) else [float(c) for c in v_clip]
    expect(len(kc) == n and len(vc) == n, "clip ratios", f"{n} per-layer values",
           (len(kc), len(vc)))
    layers = [fit_layer(s, method, per_head=per_head and method not in ("identity", "hadamard"),
                        k_clip=kc[i], v_clip=vc[i]) for i, s in enumerate(stats)]
    art = RotationArtifact(fingerprint, method, layers, dict(provenance or {}))
    art.validate()
    return art
