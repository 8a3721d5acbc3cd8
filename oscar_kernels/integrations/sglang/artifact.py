"""The rotation artifact of a served model: loaded from ``--oscar-rotation-path``, checked
against the model, and sliced to the KV heads of one tensor-parallel rank."""

from __future__ import annotations

import glob
import logging
import os

from ...errors import ArtifactError
from ...rotation import LayerRotation, ModelFingerprint, RotationArtifact
from ..tp import kv_head_range, shard_rotation

log = logging.getLogger(__name__)


def load_rotation_artifact(path: str | None, fingerprint: ModelFingerprint) -> RotationArtifact:
    """Load and validate the rotations for a model.

    ``path`` is an artifact ``.safetensors`` file, or a directory holding exactly one such
    file, or a directory holding the reference RotationZoo pair ``k_rotation_*.pt`` /
    ``v_rotation_*.pt`` (converted with :meth:`RotationArtifact.from_reference_zoo`).
    ``None`` gives the calibration-free Hadamard rotation (logged as a warning).
    Raises :class:`ArtifactError` naming the file and the mismatch.
    """
    if path is None:
        log.warning("oscar int2: no --oscar-rotation-path; using the calibration-free "
                    "Hadamard rotation (lower quality than a calibrated artifact)")
        return RotationArtifact.hadamard(fingerprint)
    if os.path.isdir(path):
        st = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        ks = sorted(glob.glob(os.path.join(path, "k_rotation_*.pt")))
        vs = sorted(glob.glob(os.path.join(path, "v_rotation_*.pt")))
        if len(st) == 1:
            art = RotationArtifact.load(st[0])
        elif len(st) > 1:
            raise ArtifactError(f"--oscar-rotation-path {path}: expected one .safetensors "
                                f"artifact, found {len(st)}: {[os.path.basename(s) for s in st]}")
        elif len(ks) == 1 and len(vs) == 1:
            art = RotationArtifact.from_reference_zoo(
                ks[0], vs[0], num_kv_heads=fingerprint.num_kv_heads,
                num_qo_heads=fingerprint.num_qo_heads)
        else:
            raise ArtifactError(f"--oscar-rotation-path {path}: expected a .safetensors "
                                "artifact or one k_rotation_*.pt / v_rotation_*.pt pair, "
                                f"found {sorted(os.listdir(path))[:10]}")
    else:
        art = RotationArtifact.load(path)
    art.check_model(fingerprint)
    return art


def rank_rotations(artifact: RotationArtifact, *, tp_rank: int, tp_size: int,
                   start_layer: int = 0, end_layer: int | None = None,
                   device=None) -> list[LayerRotation]:
    """Rotations of this rank's KV heads for layers ``[start_layer, end_layer]``, on ``device``."""
    fp = artifact.fingerprint
    h0, h1 = kv_head_range(tp_rank, tp_size, fp.num_kv_heads)
    end = fp.num_layers - 1 if end_layer is None else end_layer
    return [shard_rotation(artifact.layer(i), h0, h1, fp.num_kv_heads).to(device)
            for i in range(start_layer, end + 1)]
