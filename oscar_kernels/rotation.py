"""The rotation artifact: per-layer ``R_K``, ``R_V``, eigenvalues and clip ratios.

On disk it is one safetensors file (format in docs/format.md, section "Rotation
artifact"): tensors ``layers.{i}.rot_k`` / ``layers.{i}.rot_v`` ``[Hr, D, D]`` float32
(``Hr`` is 1 for a per-layer rotation or ``num_kv_heads`` for per-head ones), optional
``layers.{i}.k_eigenvalues`` / ``v_eigenvalues`` ``[Hr, D]``, and a JSON header under the
metadata key ``"oscar"`` with the format version, model fingerprint, method, clip ratios
and calibration provenance.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch

from .errors import ArtifactError, expect
from .reference.rotation_math import hadamard_rotation, orthogonality_error
from .spec import DEFAULT_K_CLIP, DEFAULT_V_CLIP, FORMAT_VERSION, is_power_of_two

ORTHOGONALITY_TOL = 1e-4
METADATA_KEY = "oscar"


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[str]:
    """Write a file atomically: yield a temporary path next to ``path`` to write to.

    When the block ends normally the temporary file is fsync'd and renamed onto ``path``
    (``os.replace``: readers see the old file or the new one, never a partial one); when
    it raises (``KeyboardInterrupt`` included) the temporary file is removed and ``path``
    is left as it was.

    Examples
    --------
    >>> with atomic_output("notes.txt") as tmp:            # doctest: +SKIP
    ...     with open(tmp, "w") as f:
    ...         f.write("done")
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}."
                                  f"{secrets.token_hex(4)}.tmp")
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    mode = os.stat(tmp).st_mode & 0o777  # 0o666 less the umask, whoever rewrites tmp
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class ModelFingerprint:
    """What an artifact must agree with to be used on a model."""

    num_layers: int
    num_kv_heads: int
    num_qo_heads: int
    head_dim: int


@dataclass
class LayerRotation:
    """One layer's rotations (``[Hr, D, D]`` float32, ``x_rot = x @ R``) and clip ratios."""

    rot_k: torch.Tensor
    rot_v: torch.Tensor
    k_clip: float = DEFAULT_K_CLIP
    v_clip: float = DEFAULT_V_CLIP
    k_eigenvalues: torch.Tensor | None = None
    v_eigenvalues: torch.Tensor | None = None

    @classmethod
    def identity(cls, head_dim: int, *, k_clip: float = 1.0, v_clip: float = 1.0,
                 device=None) -> "LayerRotation":
        eye = torch.eye(head_dim, dtype=torch.float32, device=device)[None]
        return cls(eye, eye.clone(), k_clip, v_clip)

    @classmethod
    def hadamard(cls, head_dim: int, *, k_clip: float = DEFAULT_K_CLIP,
                 v_clip: float = DEFAULT_V_CLIP, device=None) -> "LayerRotation":
        h = hadamard_rotation(head_dim).to(device)[None]
        return cls(h, h.clone(), k_clip, v_clip)

    @property
    def head_dim(self) -> int:
        return self.rot_k.shape[-1]

    def per_head(self, num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``R_K``, ``R_V`` expanded to ``[num_kv_heads, D, D]`` (a view when shared)."""
        out = []
        for name, r in (("rot_k", self.rot_k), ("rot_v", self.rot_v)):
            expect(r.shape[0] in (1, num_kv_heads), f"rotation.{name}",
                   f"[1 or {num_kv_heads}, D, D]", r)
            out.append(r.expand(num_kv_heads, -1, -1))
        return out[0], out[1]

    def to(self, device) -> "LayerRotation":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return LayerRotation(mv(self.rot_k), mv(self.rot_v), self.k_clip, self.v_clip,
                             mv(self.k_eigenvalues), mv(self.v_eigenvalues))

    def validate(self, where: str = "rotation") -> None:
        for name in ("rot_k", "rot_v"):
            r = getattr(self, name)
            if not isinstance(r, torch.Tensor):
                raise ArtifactError(f"{where}.{name}: expected a tensor, got {type(r).__name__}")
            if r.dtype != torch.float32:
                raise ArtifactError(f"{where}.{name}: expected float32, got {r.dtype}")
            if r.dim() != 3 or r.shape[-1] != r.shape[-2] or not is_power_of_two(r.shape[-1]):
                raise ArtifactError(f"{where}.{name}: expected [Hr, D, D] with D a power of two, "
                                    f"got shape {tuple(r.shape)}")
            if not bool(torch.isfinite(r).all()):
                raise ArtifactError(f"{where}.{name}: contains NaN or Inf")
            err = orthogonality_error(r.cpu())
            if err > ORTHOGONALITY_TOL:
                raise ArtifactError(f"{where}.{name}: expected orthogonal to {ORTHOGONALITY_TOL}, "
                                    f"got max |R R^T - I| = {err:.3g}")
        if self.rot_k.shape != self.rot_v.shape:
            raise ArtifactError(f"{where}: rot_k {tuple(self.rot_k.shape)} and rot_v "
                                f"{tuple(self.rot_v.shape)} differ in shape")
        for name in ("k_clip", "v_clip"):
            c = getattr(self, name)
            if not (isinstance(c, (int, float)) and math.isfinite(c) and 0.0 < c <= 1.0):
                raise ArtifactError(f"{where}.{name}: expected a ratio in (0, 1], got {c!r}")


@dataclass
class RotationArtifact:
    """All layers' rotations for one model, plus how they were made."""

    fingerprint: ModelFingerprint
    method: str
    layers: list[LayerRotation]
    provenance: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    # ------------------------------------------------------------ constructors
    @classmethod
    def uniform(cls, fingerprint: ModelFingerprint, method: str, layer: LayerRotation,
                provenance: dict | None = None) -> "RotationArtifact":
        """The same rotation in every layer (``identity``, ``hadamard`` baselines)."""
        layers = [LayerRotation(layer.rot_k.clone(), layer.rot_v.clone(), layer.k_clip,
                                layer.v_clip) for _ in range(fingerprint.num_layers)]
        return cls(fingerprint, method, layers, dict(provenance or {}))

    @classmethod
    def identity(cls, fingerprint: ModelFingerprint, **clip) -> "RotationArtifact":
        return cls.uniform(fingerprint, "identity",
                           LayerRotation.identity(fingerprint.head_dim, **clip))

    @classmethod
    def hadamard(cls, fingerprint: ModelFingerprint, **clip) -> "RotationArtifact":
        return cls.uniform(fingerprint, "hadamard",
                           LayerRotation.hadamard(fingerprint.head_dim, **clip))

    # ------------------------------------------------------------------ access
    def layer(self, index: int) -> LayerRotation:
        expect(0 <= index < len(self.layers), "layer index",
               f"0 <= index < {len(self.layers)}", index)
        return self.layers[index]

    @property
    def per_head(self) -> bool:
        return bool(self.layers) and self.layers[0].rot_k.shape[0] > 1

    def to(self, device) -> "RotationArtifact":
        return RotationArtifact(self.fingerprint, self.method,
                                [lr.to(device) for lr in self.layers],
                                dict(self.provenance), self.format_version)

    # -------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise :class:`ArtifactError` on any inconsistency (shapes, NaN, orthogonality)."""
        fp = self.fingerprint
        if self.format_version != FORMAT_VERSION:
            raise ArtifactError(f"format_version: expected {FORMAT_VERSION}, "
                                f"got {self.format_version}")
        if len(self.layers) != fp.num_layers:
            raise ArtifactError(f"layers: expected {fp.num_layers} (fingerprint.num_layers), "
                                f"got {len(self.layers)}")
        if fp.num_kv_heads <= 0 or fp.num_qo_heads % fp.num_kv_heads != 0:
            raise ArtifactError(f"fingerprint: num_qo_heads={fp.num_qo_heads} must be a "
                                f"multiple of num_kv_heads={fp.num_kv_heads}")
        for i, lr in enumerate(self.layers):
            where = f"layers[{i}]"
            lr.validate(where)
            if lr.rot_k.shape[-1] != fp.head_dim:
                raise ArtifactError(f"{where}.rot_k: expected head_dim {fp.head_dim}, "
                                    f"got {lr.rot_k.shape[-1]}")
            if lr.rot_k.shape[0] not in (1, fp.num_kv_heads):
                raise ArtifactError(f"{where}.rot_k: expected 1 or {fp.num_kv_heads} heads, "
                                    f"got {lr.rot_k.shape[0]}")

    def check_model(self, fingerprint: ModelFingerprint) -> None:
        """Raise :class:`ArtifactError` if this artifact was made for another model."""
        if fingerprint != self.fingerprint:
            raise ArtifactError(f"artifact made for another model: expected {fingerprint}, "
                                f"artifact has {self.fingerprint}")

    # ---------------------------------------------------------------- file i/o
    def save(self, path: str | os.PathLike) -> None:
        """Validate and write the artifact to ``path`` atomically (:func:`atomic_output`):
        an interrupted save leaves no partial file and keeps an existing one intact."""
        from safetensors.torch import save_file

        self.validate()
        tensors = {}
        for i, lr in enumerate(self.layers):
            tensors[f"layers.{i}.rot_k"] = lr.rot_k.detach().cpu().contiguous()
            tensors[f"layers.{i}.rot_v"] = lr.rot_v.detach().cpu().contiguous()
            for name in ("k_eigenvalues", "v_eigenvalues"):
                t = getattr(lr, name)
                if t is not None:
                    tensors[f"layers.{i}.{name}"] = t.detach().cpu().to(torch.float32).contiguous()
        header = {
            "format_version": self.format_version,
            "fingerprint": asdict(self.fingerprint),
            "method": self.method,
            "k_clip": [float(lr.k_clip) for lr in self.layers],
            "v_clip": [float(lr.v_clip) for lr in self.layers],
            "provenance": self.provenance,
        }
        with atomic_output(path) as tmp:
            save_file(tensors, tmp, metadata={METADATA_KEY: json.dumps(header)})

    @classmethod
    def load(cls, path: str | os.PathLike, *, validate: bool = True) -> "RotationArtifact":
        """Load an artifact written by :meth:`save` (or a RotationZoo ``.pt`` pair: see
        :meth:`from_reference_zoo`)."""
        from safetensors import safe_open

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ArtifactError(f"path: expected a rotation artifact file, got {path!r} "
                                "(not a file)")
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:  # safetensors raises its own error types
            raise ArtifactError(f"{path}: not a readable safetensors file ({exc})") from exc
        if METADATA_KEY not in meta:
            raise ArtifactError(f"{path}: no '{METADATA_KEY}' header; not an oscar artifact")
        try:
            header = json.loads(meta[METADATA_KEY])
            fp = ModelFingerprint(**header["fingerprint"])
            n = fp.num_layers
            layers = []
            for i in range(n):
                layers.append(LayerRotation(
                    tensors[f"layers.{i}.rot_k"], tensors[f"layers.{i}.rot_v"],
                    float(header["k_clip"][i]), float(header["v_clip"][i]),
                    tensors.get(f"layers.{i}.k_eigenvalues"),
                    tensors.get(f"layers.{i}.v_eigenvalues")))
        except (KeyError, TypeError, IndexError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"{path}: malformed header or missing tensor ({exc!r})") from exc
        art = cls(fp, header.get("method", "unknown"), layers, header.get("provenance", {}),
                  int(header.get("format_version", -1)))
        if validate:
            art.validate()
        return art

    @classmethod
    def from_reference_zoo(cls, k_path: str | os.PathLike, v_path: str | os.PathLike, *,
                           num_kv_heads: int, num_qo_heads: int,
                           k_clip: float = DEFAULT_K_CLIP, v_clip: float = DEFAULT_V_CLIP,
                           validate: bool = True) -> "RotationArtifact":
        """Convert the published reference's RotationZoo pair ``{k,v}_rotation_*.pt``.

        Each file is a dict ``{"format_version", "objective", "layers": {id: {"rotation":
        [D, D] float32, "eigenvalues": [D]}}}``, read with ``torch.load(weights_only=True)``
        (no code runs). Rotations are taken in this package's convention ``x_rot = x @ R``.
        """
        zoo = {}
        for tag, p in (("k", k_path), ("v", v_path)):
            try:
                obj = torch.load(os.fspath(p), map_location="cpu", weights_only=True)
            except Exception as exc:
                raise ArtifactError(f"{p}: cannot be loaded safely as a RotationZoo file "
                                    f"({exc})") from exc
            if not isinstance(obj, dict) or not isinstance(obj.get("layers"), dict):
                raise ArtifactError(f"{p}: expected a dict with a 'layers' dict, got "
                                    f"{type(obj).__name__} with keys "
                                    f"{sorted(obj) if isinstance(obj, dict) else '-'}")
            zoo[tag] = obj
        k_layers = {int(i): v for i, v in zoo["k"]["layers"].items()}
        v_layers = {int(i): v for i, v in zoo["v"]["layers"].items()}
        if sorted(k_layers) != sorted(v_layers) or sorted(k_layers) != list(range(len(k_layers))):
            raise ArtifactError(f"RotationZoo: K layers {sorted(k_layers)} and V layers "
                                f"{sorted(v_layers)} must both be 0..N-1")
        layers = []
        for i in range(len(k_layers)):
            def take(entry, tag):
                try:
                    r = entry["rotation"].to(torch.float32)
                except (KeyError, TypeError, AttributeError) as exc:
                    raise ArtifactError(f"RotationZoo {tag} layer {i}: no 'rotation' "
                                        "tensor") from exc
                if r.dim() == 2:
                    r = r[None]
                ev = entry.get("eigenvalues")
                if ev is not None:
                    ev = ev.to(torch.float32).reshape(r.shape[0], -1)
                return r, ev
            rk, ek = take(k_layers[i], "K")
            rv, ev = take(v_layers[i], "V")
            layers.append(LayerRotation(rk, rv, k_clip, v_clip, ek, ev))
        head_dim = layers[0].rot_k.shape[-1] if layers else 0
        fp = ModelFingerprint(len(layers), num_kv_heads, num_qo_heads, head_dim)
        art = cls(fp, f"reference-zoo:{zoo['k'].get('objective', 'unknown')}", layers,
                  {"source": [os.fspath(k_path), os.fspath(v_path)],
                   "zoo_format_version": str(zoo["k"].get("format_version"))})
        if validate:
            art.validate()
        return art
