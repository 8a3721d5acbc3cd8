"""The rows of an evaluation: how each method stores and reads K/V.

Every method runs the same model on the same held-out windows:

* ``bf16``: the unmodified model (its own attention, full-precision K/V);
* INT2 format v1 methods: a rotation artifact (``naive`` = identity rotation,
  ``hadamard``, ``kv-cov``, ``oscar`` or any artifact given) under a clip policy:
  ``fixed`` (K 0.96, V 0.92 in every layer) or ``searched`` (the artifact's per-layer
  ratios, written by ``oscar-kv calibrate --clip search``). Scored by the exact
  teacher-forced emulation of :mod:`oscar_kernels.integrations.transformers` (query ``t``
  reads BF16 for ``p < sink`` or ``p > t - recent``, INT2 otherwise);
* ``kivi``: KIVI-2 (:mod:`oscar_kernels.evaluation.kivi`), emulation only.

:class:`Method` also says how many bits per K/V element a row costs: the INT2 region
(codes + fp16 scale/zero, :class:`~oscar_kernels.spec.CacheSpec`) or a whole cache with
its BF16 windows (KIVI: its fp16 residual, :func:`~oscar_kernels.evaluation.kivi.kivi_bits`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import expect
from ..rotation import RotationArtifact
from ..spec import DEFAULT_K_CLIP, DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE, DEFAULT_V_CLIP

BASELINE = "bf16"
BUILTIN_METHODS = ("bf16", "naive", "hadamard", "kivi", "oscar")
CLIP_POLICIES = ("fixed", "searched")
#: artifact ``method`` field -> row name
METHOD_NAMES = {"identity": "naive"}


@dataclass
class Method:
    """One row of the table: how K/V are stored and read.

    ``kind`` is ``"bf16"``, ``"int2"`` (format v1, needs ``artifact``) or ``"kivi"``;
    ``clip`` is ``"fixed"``, ``"searched"`` or ``"none"``.
    """

    name: str
    kind: str
    clip: str = "none"
    artifact: RotationArtifact | None = None
    source: str = "-"
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    group_size: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.kind != "int2" else f"{self.name} ({self.clip} clip)"

    def scheme(self):
        """The :class:`Int2Scheme` of an ``int2`` method (fixed policy: clips overridden)."""
        from ..integrations.transformers import Int2Scheme

        expect(self.kind == "int2", "method.kind", "'int2'", self.kind)
        clip = ({"k_clip": DEFAULT_K_CLIP, "v_clip": DEFAULT_V_CLIP} if self.clip == "fixed"
                else {})
        return Int2Scheme.from_artifact(self.artifact, sink_size=self.sink_size,
                                        recent_size=self.recent_size,
                                        group_size=self.group_size, **clip)

    def rules(self, num_layers: int):
        """Per-layer emulation rules (``None`` for ``bf16``)."""
        if self.kind == "bf16":
            return None
        if self.kind == "kivi":
            from .kivi import kivi_rules

            return kivi_rules(num_layers)
        return self.scheme().rules(num_layers)

    def clip_ratios(self) -> tuple[list[float], list[float]] | None:
        if self.kind != "int2":
            return None
        if self.clip == "fixed":
            n = len(self.artifact.layers)
            return [DEFAULT_K_CLIP] * n, [DEFAULT_V_CLIP] * n
        return ([float(lr.k_clip) for lr in self.artifact.layers],
                [float(lr.v_clip) for lr in self.artifact.layers])

    def bits(self, fingerprint, seq_len: int | None = None) -> float:
        """Bits per K/V element: INT2 region (``seq_len=None``) or a whole cache."""
        if self.kind == "bf16":
            return 16.0
        if self.kind == "kivi":
            from .kivi import kivi_bits

            return kivi_bits(seq_len)
        from ..spec import CacheSpec

        spec = CacheSpec(num_kv_heads=fingerprint.num_kv_heads, head_dim=fingerprint.head_dim,
                         page_size=1, group_size=self.group_size or fingerprint.head_dim,
                         sink_size=self.sink_size, recent_size=self.recent_size)
        if seq_len is None:
            return 8.0 * spec.int2_bytes_per_token / (2 * spec.num_kv_heads * spec.head_dim)
        return spec.effective_bits(seq_len)


def artifact_clip_policy(art: RotationArtifact) -> str:
    """``"searched"`` when the artifact says its clips were searched
    (``provenance["clip_policy"] == "search"``), ``"fixed"`` otherwise."""
    pol = str(art.provenance.get("clip_policy", "")).lower()
    return "searched" if pol in ("search", "searched") else "fixed"


def parse_rotation_arg(text: str) -> tuple[str | None, str]:
    """``"NAME=PATH"`` → ``(NAME, PATH)``; ``"PATH"`` → ``(None, PATH)``."""
    if "=" in text and not os.path.exists(text):
        name, path = text.split("=", 1)
        expect(bool(name) and bool(path), "--rotations", "PATH or NAME=PATH", text)
        return name, path
    return None, text


def artifact_files(path: str) -> list[str]:
    """The artifact files one ``--rotations`` path names: the file itself, or every
    ``*.safetensors`` in a directory (sorted)."""
    paths = ([os.path.join(path, f) for f in sorted(os.listdir(path))
              if f.endswith(".safetensors")] if os.path.isdir(path) else [path])
    expect(len(paths) > 0, "--rotations", "a file or a directory with .safetensors files",
           path)
    return paths


def load_rotations(specs: Sequence[str], fingerprint) -> dict[str, tuple[RotationArtifact, str]]:
    """Load ``--rotations`` entries (``PATH`` or ``NAME=PATH``; a directory loads every
    ``*.safetensors`` in it), check each against the model; name defaults to the
    artifact's method (``identity`` → ``naive``)."""
    out: dict[str, tuple[RotationArtifact, str]] = {}
    for text in specs:
        name, path = parse_rotation_arg(text)
        paths = artifact_files(path)
        for p in paths:
            art = RotationArtifact.load(p)
            art.check_model(fingerprint)
            n = name if (name and len(paths) == 1) else METHOD_NAMES.get(art.method, art.method)
            if name and len(paths) > 1:
                n = f"{name}/{n}"
            expect(n not in out, "--rotations", "distinct names", n)
            out[n] = (art, os.path.abspath(p))
    return out


def build_methods(fingerprint, rotations: dict[str, tuple[RotationArtifact, str]],
                  methods: Sequence[str], clips: Sequence[str], *,
                  sink_size: int = DEFAULT_SINK_SIZE, recent_size: int = DEFAULT_RECENT_SIZE,
                  group_size: int | None = None) -> tuple[list[Method], list[str]]:
    """Rows for ``methods`` (built-in names and/or names of loaded rotations) under
    ``clips``. Returns the rows and notes on rows that could not be built.

    ``naive``/``hadamard`` need no artifact for the fixed policy; a searched row needs
    an artifact whose clips were searched. ``oscar`` (and any other rotation) needs an
    artifact.
    """
    expect(len(methods) > 0, "--methods", "at least one method", list(methods))
    for c in clips:
        expect(c in CLIP_POLICIES, "--clip", f"values in {CLIP_POLICIES}", c)
    kw = dict(sink_size=sink_size, recent_size=recent_size, group_size=group_size)
    rows: list[Method] = []
    notes: list[str] = []
    names = list(dict.fromkeys(list(methods)))
    for name in names:
        if name == "bf16":
            rows.append(Method("bf16", "bf16"))
            continue
        if name == "kivi":
            rows.append(Method("kivi", "kivi", "none", source="KIVI-2 (emulated)"))
            continue
        art, src = rotations.get(name, (None, None))
        for clip in clips:
            if art is not None and (clip == "fixed" or artifact_clip_policy(art) == "searched"):
                rows.append(Method(name, "int2", clip, art, src, **kw))
            elif art is None and clip == "fixed" and name in ("naive", "hadamard"):
                built = (RotationArtifact.identity(fingerprint) if name == "naive"
                         else RotationArtifact.hadamard(fingerprint))
                rows.append(Method(name, "int2", clip, built, "built-in", **kw))
            elif art is None:
                notes.append(f"{name} ({clip} clip): no rotation artifact given "
                             f"(--rotations {name}=PATH)")
            else:
                notes.append(f"{name} ({clip} clip): artifact {src} has fixed clips; make one "
                             "with `oscar-kv calibrate --clip search`")
    return rows, notes
