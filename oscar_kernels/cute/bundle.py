"""Find and load the CuTe kernels: the ahead-of-time bundle, or JIT through
``nvidia-cutlass-dsl``.

A bundle is a directory with ``manifest.json`` and one ``lib<name>.so`` per kernel (C ABI
``int <name>_load(void)`` and ``int <name>_run(...)`` with the arguments of
:data:`~oscar_kernels.cute.config.DECODE_PTR_ARGS` / ``DECODE_INT_ARGS`` (int64 pointers,
int32), ``scale_log2`` and the stream for the decode ops, of ``MERGE_PTR_ARGS`` /
``MERGE_INT_ARGS`` and the stream for ``merge``). The decode ops exist for CTAs of 4 warps
(every head_dim) and 8 warps (``_w8``, head_dim 128; manifest ``"warps"``);
``decode_anypage`` / ``decode_pair_anypage`` (4 warps) take pages whose size is not a
multiple of 16 (a bundle without them falls back for such caches); ``decode_pair_mc`` (8
warps) and ``decode_pair_ring4`` (4 and 8 warps, a 4-deep ring) are head_dim-128 builds of
``decode_pair`` that the host picks for some shapes when present. A manifest may record
``"debug"`` flags (a debug build, :attr:`~oscar_kernels.cute.config.Int2DecodeConfig.debug`).

Where kernels come from (the one selector): ``$OSCAR_CUTE_BUNDLE``, when set, names the
bundle directory to load; unset, kernels JIT-compile when ``nvidia-cutlass-dsl`` is
installed, else come from the shipped bundle ``oscar_kernels/cute/prebuilt``. Nothing here
needs a GPU to import; loading a library needs ``libcudart.so.13`` (import torch first, it
loads it).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import logging
import os
import stat
import threading
from typing import Callable

from ..errors import BackendUnavailableError
from .config import DECODE_INT_ARGS, DECODE_PTR_ARGS, MERGE_INT_ARGS, MERGE_PTR_ARGS

log = logging.getLogger(__name__)

#: 2: fp16 rotation operands (format 1 took float32 R_K / R_V); 3: partials in the model's
#: space (every split applies R_V^T), the merge kernel takes no rotation
BUNDLE_FORMAT = 3
#: C argument types of each kernel, in order (pointers as int64, then ints, floats, stream).
_DECODE_ARGS = ([ctypes.c_int64] * len(DECODE_PTR_ARGS) + [ctypes.c_int32] * len(DECODE_INT_ARGS)
                + [ctypes.c_float, ctypes.c_void_p])
_ARGTYPES = {
    "decode": _DECODE_ARGS,
    "decode_pair": _DECODE_ARGS,        # the same launcher, specialized for GQA <= 4
    "merge": ([ctypes.c_int64] * len(MERGE_PTR_ARGS) + [ctypes.c_int32] * len(MERGE_INT_ARGS)
              + [ctypes.c_void_p]),
    "decode_anypage": _DECODE_ARGS,     # pages of any size (not a multiple of 16)
    "decode_pair_anypage": _DECODE_ARGS,
    "decode_pair_mc": _DECODE_ARGS,     # the wide pair build with merge CTAs (8 warps)
    "decode_pair_ring4": _DECODE_ARGS,  # the pair kernel with a 4-deep ring (head_dim 128)
}
OPS = tuple(_ARGTYPES)
#: the ops a head_dim needs to count as available (the any-page ones are optional)
CORE_OPS = ("decode", "decode_pair", "merge")
#: ops that also have a wide build (8 warps per CTA) at head_dim 128; decode_pair_mc has
#: only that one, decode_pair_ring4 exists at head_dim 128 only
_WIDE_OPS = ("decode", "decode_pair", "decode_pair_mc", "decode_pair_ring4")


def build_options(op: str, head_dim: int, warps: int = 4) -> dict | None:
    """``Int2DecodeConfig`` keyword arguments of the build that runs ``op`` for ``head_dim``
    with CTAs of ``warps`` warps, or None where there is none. The one list of builds: what
    ``python -m oscar_kernels.cute.aot build`` bundles (for each head_dim it is given) and
    what JIT mode compiles. (``merge`` is compiled from its decode's config.)"""
    if op not in _ARGTYPES:
        return None
    if warps == 8:
        if head_dim != 128 or op not in _WIDE_OPS:
            return None
    elif warps != 4 or op == "decode_pair_mc":
        return None
    if op == "decode_pair_ring4" and head_dim != 128:
        return None
    return {"head_dim": head_dim, "pair": op.startswith("decode_pair"), "warps": warps,
            "any_page": op.endswith("_anypage"), "merge_ctas": op == "decode_pair_mc",
            "stages": 4 if op == "decode_pair_ring4" else 0}

_lock = threading.Lock()
_cache: dict[str, Callable] = {}


#: The one environment variable the package reads: a bundle directory to load kernels from.
BUNDLE_ENV = "OSCAR_CUTE_BUNDLE"


def bundle_dir() -> str:
    """The bundle directory: ``$OSCAR_CUTE_BUNDLE``, else the shipped ``prebuilt``."""
    return os.environ.get(BUNDLE_ENV) or os.path.join(os.path.dirname(__file__), "prebuilt")


def kernel_name(op: str, head_dim: int, warps: int = 4) -> str:
    wide = "_w8" if warps == 8 else ""
    return {"decode": f"int2_decode{wide}_sm90_d{head_dim}",
            "decode_pair": f"int2_decode_pair{wide}_sm90_d{head_dim}",
            "decode_anypage": f"int2_decode_anypage{wide}_sm90_d{head_dim}",
            "decode_pair_anypage": f"int2_decode_pair_anypage{wide}_sm90_d{head_dim}",
            "decode_pair_mc": f"int2_decode_pair_mc{wide}_sm90_d{head_dim}",
            "decode_pair_ring4": f"int2_decode_pair_ring4{wide}_sm90_d{head_dim}",
            "merge": f"int2_decode_merge_sm90_d{head_dim}"}[op]


@functools.lru_cache(maxsize=None)
def cutlass_available() -> bool:
    """Whether ``nvidia-cutlass-dsl`` is importable (looked up once per process: every
    decode call asks, through :func:`mode`)."""
    return importlib.util.find_spec("cutlass") is not None


def mode() -> str:
    """``"jit"`` or ``"bundle"``: where kernels come from in this process (a bundle when
    ``$OSCAR_CUTE_BUNDLE`` is set or ``nvidia-cutlass-dsl`` is not installed)."""
    if os.environ.get(BUNDLE_ENV):
        return "bundle"
    return "jit" if cutlass_available() else "bundle"


#: manifest.json path -> ((mtime_ns, size, inode), parsed manifest, has_kernel answers):
#: every decode call asks which builds exist, so a file is parsed again only when it changed
_manifests: dict[str, tuple[tuple[int, int, int], dict, dict]] = {}


def read_manifest(path: str | None = None) -> dict:
    """Parse and check ``manifest.json`` of a bundle (cached until the file changes; the
    returned dict is shared, do not modify it); raise BackendUnavailableError."""
    return _manifest_entry(path)[1]


def _manifest_entry(path: str | None = None) -> tuple:
    """``(stat key, manifest, has_kernel memo)`` of a bundle's checked ``manifest.json``."""
    path = path or bundle_dir()
    mf = os.path.join(path, "manifest.json")
    try:
        st = os.stat(mf)
    except OSError:
        st = None
    if st is not None:
        hit = _manifests.get(mf)
        if hit is not None and hit[0] == (st.st_mtime_ns, st.st_size, st.st_ino):
            return hit
    if st is None or not stat.S_ISREG(st.st_mode):
        raise BackendUnavailableError(
            f"no CuTe bundle at {path!r} (manifest.json missing) and nvidia-cutlass-dsl is not "
            "installed; build one with `python -m oscar_kernels.cute.aot build`")
    try:
        with open(mf) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise BackendUnavailableError(f"unreadable CuTe bundle manifest {mf!r}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("bundle_format") != BUNDLE_FORMAT:
        raise BackendUnavailableError(
            f"CuTe bundle {mf!r}: expected bundle_format {BUNDLE_FORMAT}, got "
            f"{manifest.get('bundle_format') if isinstance(manifest, dict) else manifest!r}")
    kernels = manifest.get("kernels")
    if not isinstance(kernels, dict):
        raise BackendUnavailableError(f"CuTe bundle {mf!r}: 'kernels' is not an object")
    entry = _manifests[mf] = ((st.st_mtime_ns, st.st_size, st.st_ino), manifest, {})
    return entry


def available_head_dims() -> tuple[int, ...]:
    """Head dims with a kernel in this process (raises BackendUnavailableError if none)."""
    if mode() == "jit":
        return (64, 128)
    _, manifest, memo = _manifest_entry()
    dims = memo.get("head_dims")
    if dims is None:    # once per manifest version (every op call asks, via can_implement)
        found: dict[int, set] = {}
        for name, entry in manifest["kernels"].items():
            lib = os.path.join(bundle_dir(), str(entry.get("library", "")))
            if entry.get("op") in OPS and entry.get("warps", 4) == 4 and os.path.isfile(lib):
                found.setdefault(int(entry["head_dim"]), set()).add(entry["op"])
        dims = memo["head_dims"] = tuple(sorted(d for d, ops in found.items()
                                                if set(CORE_OPS) <= ops))
    if not dims:
        raise BackendUnavailableError(f"CuTe bundle {bundle_dir()!r} holds no decode kernel")
    return dims


def has_kernel(op: str, head_dim: int, warps: int = 4) -> bool:
    """Whether this process can run ``op`` for ``head_dim`` with CTAs of ``warps`` warps
    (JIT: every valid combination; a bundle: what its manifest lists)."""
    if mode() == "jit":
        return build_options(op, head_dim, warps) is not None
    try:
        _, manifest, memo = _manifest_entry()
    except BackendUnavailableError:
        return False
    key = (op, head_dim, warps)
    found = memo.get(key)
    if found is None:   # once per manifest version (a library deleted later fails to load)
        entry = manifest["kernels"].get(kernel_name(op, head_dim, warps))
        found = memo[key] = (
            entry is not None and entry.get("warps", 4) == warps
            and os.path.isfile(os.path.join(bundle_dir(), str(entry.get("library", "")))))
    return found


def debug_flags() -> frozenset:
    """The debug flags the kernels of this process were built with (a bundle's manifest
    ``"debug"``; none in JIT mode or for a bundle without the key). The launcher makes room
    for the trace stamps when ``"trace"`` is among them."""
    if mode() == "jit":
        return frozenset()
    try:
        _, manifest, _ = _manifest_entry()
    except BackendUnavailableError:
        return frozenset()
    return frozenset(manifest.get("debug", ()))


def _load_bundle_kernel(op: str, head_dim: int, warps: int) -> Callable:
    name = kernel_name(op, head_dim, warps)
    manifest = read_manifest()
    entry = manifest["kernels"].get(name)
    if entry is None:
        raise BackendUnavailableError(f"CuTe bundle {bundle_dir()!r} has no kernel {name!r}")
    path = os.path.join(bundle_dir(), entry["library"])
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise BackendUnavailableError(f"cannot load {path!r}: {exc}") from exc
    load = getattr(lib, f"{name}_load")
    load.restype = ctypes.c_int
    run = getattr(lib, f"{name}_run")
    run.restype = ctypes.c_int
    run.argtypes = _ARGTYPES[op]
    rc = load()
    if rc != 0:
        raise BackendUnavailableError(f"{path}: loading the CUDA module failed (cudaError {rc})")

    def launch(*args) -> None:
        rc = run(*args)
        if rc != 0:
            raise RuntimeError(f"{name}: launch failed with status {rc}")

    log.info("oscar_kernels.cute: loaded %s from the bundle %s", name, path)
    return launch


def _load_jit_kernel(op: str, head_dim: int, warps: int) -> Callable:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import cuda.bindings.driver as cuda

    from .config import Int2DecodeConfig
    from .decode_sm90 import compile_decode
    from .merge_sm90 import compile_merge

    options = build_options(op, head_dim, warps)
    if options is None:
        raise BackendUnavailableError(f"no CuTe build of {op!r} for head_dim {head_dim} with "
                                      f"{warps} warps per CTA")
    cfg = Int2DecodeConfig(**options)
    compiled = (compile_merge if op == "merge" else compile_decode)(cfg)

    def launch(*args) -> None:
        *rest, stream = args
        compiled(*rest, cuda.CUstream(stream))

    return launch


def get_kernel(op: str, head_dim: int, warps: int = 4) -> Callable:
    """The launcher of ``op`` (one of :data:`OPS`) with CTAs of ``warps`` warps:
    ``f(*args, stream_handle)`` (cached)."""
    key = f"{mode()}:{op}:{head_dim}:{warps}"
    with _lock:
        fn = _cache.get(key)
        if fn is None:
            fn = (_load_jit_kernel(op, head_dim, warps) if mode() == "jit"
                  else _load_bundle_kernel(op, head_dim, warps))
            _cache[key] = fn
    return fn
