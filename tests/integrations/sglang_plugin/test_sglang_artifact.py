"""oscar_kernels.integrations.sglang.artifact: loading the rotation artifact from a file, a
directory or a RotationZoo pair, and slicing it per TP rank (no SGLang needed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import random_rotation
from oscar_kernels import ArtifactError, ModelFingerprint, RotationArtifact
from oscar_kernels.integrations.sglang.artifact import load_rotation_artifact, rank_rotations


def test_artifact_loading_and_rank_slices(tmp_path, gen):
    fp = ModelFingerprint(num_layers=2, num_kv_heads=4, num_qo_heads=8, head_dim=32)
    layers = [random_rotation(4, 32, gen) for _ in range(2)]
    art = RotationArtifact(fp, "test", layers)
    d = tmp_path / "rot"
    d.mkdir()
    art.save(d / "a.safetensors")
    for path in (d, d / "a.safetensors"):
        got = load_rotation_artifact(str(path), fp)
        assert torch.equal(got.layer(1).rot_v, layers[1].rot_v)
    with pytest.raises(ArtifactError, match="another model"):
        load_rotation_artifact(str(d), dataclasses.replace(fp, num_kv_heads=8))
    art.save(d / "b.safetensors")
    with pytest.raises(ArtifactError, match="expected one .safetensors"):
        load_rotation_artifact(str(d), fp)
    # the reference RotationZoo pair, per-layer rotations
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for tag, name in (("k", "rot_k"), ("v", "rot_v")):
        torch.save({"format_version": 1, "objective": "oscar",
                    "layers": {str(i): {"rotation": getattr(layers[i], name)[0],
                                        "eigenvalues": torch.rand(32)} for i in range(2)}},
                   zoo / f"{tag}_rotation_test.pt")
    got = load_rotation_artifact(str(zoo), fp)
    assert torch.equal(got.layer(0).rot_k[0], layers[0].rot_k[0])
    # per-rank slices follow their heads
    per_rank = rank_rotations(art, tp_rank=1, tp_size=2)
    assert torch.equal(per_rank[1].rot_k, layers[1].rot_k[2:4])
    hada = load_rotation_artifact(None, fp)
    assert hada.method == "hadamard"
