"""Rotation artifact: save/load round trip, validation errors, RotationZoo import."""

import json

import pytest
import torch
from safetensors.torch import save_file

from helpers import random_orthogonal
from oscar_kernels import ArtifactError, LayerRotation, ModelFingerprint, RotationArtifact
from oscar_kernels.rotation import METADATA_KEY

FP = ModelFingerprint(num_layers=3, num_kv_heads=2, num_qo_heads=6, head_dim=64)


def _artifact(gen, per_head=True):
    h = FP.num_kv_heads if per_head else 1
    layers = [LayerRotation(random_orthogonal(h, 64, gen), random_orthogonal(h, 64, gen),
                            0.9 + 0.01 * i, 0.8 + 0.02 * i,
                            torch.rand(h, 64, generator=gen), torch.rand(h, 64, generator=gen))
              for i in range(FP.num_layers)]
    return RotationArtifact(FP, "oscar", layers, {"tokens": 123, "text": ["a.txt"]})


@pytest.mark.parametrize("per_head", [True, False])
def test_round_trip(tmp_path, gen, per_head):
    art = _artifact(gen, per_head)
    path = tmp_path / "rot.safetensors"
    art.save(path)
    back = RotationArtifact.load(path)
    assert back.fingerprint == FP and back.method == "oscar" and back.per_head == per_head
    assert back.provenance == {"tokens": 123, "text": ["a.txt"]}
    for a, b in zip(art.layers, back.layers):
        assert torch.equal(a.rot_k, b.rot_k) and torch.equal(a.rot_v, b.rot_v)
        assert torch.equal(a.k_eigenvalues, b.k_eigenvalues)
        assert (a.k_clip, a.v_clip) == (b.k_clip, b.v_clip)


def test_baselines_validate():
    for art in (RotationArtifact.identity(FP), RotationArtifact.hadamard(FP)):
        art.validate()
        assert len(art.layers) == 3


def test_not_orthogonal(gen):
    art = _artifact(gen)
    art.layers[1].rot_v = art.layers[1].rot_v * 1.01
    with pytest.raises(ArtifactError, match=r"layers\[1\].rot_v: expected orthogonal"):
        art.validate()


def test_nan(gen):
    art = _artifact(gen)
    art.layers[0].rot_k[0, 0, 0] = float("nan")
    with pytest.raises(ArtifactError, match="NaN"):
        art.validate()


def test_shape_mismatch(gen):
    art = _artifact(gen)
    art.layers[2].rot_k = random_orthogonal(2, 128, gen)
    with pytest.raises(ArtifactError, match="differ in shape|head_dim"):
        art.validate()
    art = _artifact(gen)
    art.layers.pop()
    with pytest.raises(ArtifactError, match="expected 3"):
        art.validate()


def test_other_model(gen):
    art = _artifact(gen)
    with pytest.raises(ArtifactError, match="another model"):
        art.check_model(ModelFingerprint(3, 2, 8, 64))
    art.check_model(FP)


def test_load_errors(tmp_path):
    with pytest.raises(ArtifactError, match="not a file"):
        RotationArtifact.load(tmp_path / "missing.safetensors")
    p = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(p))
    with pytest.raises(ArtifactError, match="not an oscar artifact"):
        RotationArtifact.load(p)
    p2 = tmp_path / "bad.safetensors"
    save_file({"x": torch.zeros(2)}, str(p2), metadata={METADATA_KEY: json.dumps({"x": 1})})
    with pytest.raises(ArtifactError, match="malformed"):
        RotationArtifact.load(p2)
    p3 = tmp_path / "garbage.safetensors"
    p3.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ArtifactError, match="not a readable"):
        RotationArtifact.load(p3)


def test_reference_zoo_import(tmp_path, gen):
    d = 64
    k = {"format_version": 1, "objective": "query_cov",
         "layers": {i: {"rotation": random_orthogonal(1, d, gen)[0], "eigenvalues": torch.rand(d)}
                    for i in range(3)}}
    v = {"format_version": 1, "objective": "score_weighted_value_cov",
         "layers": {str(i): {"rotation": random_orthogonal(1, d, gen)[0],
                             "eigenvalues": torch.rand(d)} for i in range(3)}}
    torch.save(k, tmp_path / "k_rotation_smollm.pt")
    torch.save(v, tmp_path / "v_rotation_smollm.pt")
    art = RotationArtifact.from_reference_zoo(tmp_path / "k_rotation_smollm.pt",
                                              tmp_path / "v_rotation_smollm.pt",
                                              num_kv_heads=2, num_qo_heads=6)
    assert art.fingerprint == FP
    assert torch.equal(art.layers[1].rot_k[0], k["layers"][1]["rotation"])
    assert torch.equal(art.layers[2].rot_v[0], v["layers"]["2"]["rotation"])
    assert art.layers[0].k_clip == 0.96 and art.layers[0].v_clip == 0.92
    art.save(tmp_path / "converted.safetensors")
    RotationArtifact.load(tmp_path / "converted.safetensors")


def test_reference_zoo_rejects_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    torch.save({"layers": {0: Evil()}}, tmp_path / "k.pt")
    torch.save({"layers": {0: Evil()}}, tmp_path / "v.pt")
    with pytest.raises(ArtifactError, match="safely"):
        RotationArtifact.from_reference_zoo(tmp_path / "k.pt", tmp_path / "v.pt",
                                            num_kv_heads=1, num_qo_heads=1)


def test_reference_zoo_malformed(tmp_path):
    torch.save({"nolayers": 1}, tmp_path / "k.pt")
    torch.save({"layers": {}}, tmp_path / "v.pt")
    with pytest.raises(ArtifactError, match="'layers'"):
        RotationArtifact.from_reference_zoo(tmp_path / "k.pt", tmp_path / "v.pt",
                                            num_kv_heads=1, num_qo_heads=1)
