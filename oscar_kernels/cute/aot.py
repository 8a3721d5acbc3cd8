"""Ahead-of-time build of the CuTe DSL kernels into a small prebuilt bundle.

Runs on a machine without a GPU (``CUTE_DSL_ARCH=sm_90a``), in an environment with
``nvidia-cutlass-dsl`` (Python 3.12, the cu13 flavour) and a CUDA 13 toolkit
(``cuda_runtime.h`` and ``libcudart.so`` for the link)::

    CUTE_DSL_ARCH=sm_90a python -m oscar_kernels.cute.aot build \\
        --out oscar_kernels/cute/prebuilt --cuda "$CUDA_HOME"

(``python`` being the interpreter of that environment, ``--cuda`` the toolkit's root).
``--debug trace`` (or phase skips, see
:data:`~oscar_kernels.cute.config.DEBUG_FLAGS`) builds a debug bundle whose manifest
records the flags, ``--k-operands`` / ``--rank-weights`` measurement variants.

For every static compile key (``head_dim`` in {64, 128}; GQA class; page sizes that are a
multiple of 16 or any (``*_anypage``); at head_dim 128 also CTAs of 8 warps, and the wide
pair build with merge CTAs, ``decode_pair_mc``; at head_dim 128 the pair kernel with a
4-deep ring, ``decode_pair_ring4``, of 4 and 8 warps; the list is
:func:`oscar_kernels.cute.bundle.build_options`) it ``cute.compile``s the decode kernel
(query rotation, attention, and for few splits the merge in one launch) and the separate
split merge, ``export_to_c`` (an object file embedding the sm_90a cubin), then links a
~40 KB shared library against the DSL's ``libcuda_dialect_runtime_static.a`` and
``libcudart.so.13`` (loaded by torch on the GPU machine) with a two-function C ABI::

    int <name>_load(void);                    /* cudaError_t of loading the module */
    int <name>_run(int64 x18, int32 x18, float, void *stream);          (decode)
    int <name>_run(int64 x4, int32 x7, void *stream);                   (merge)

(the arguments of :data:`~oscar_kernels.cute.config.DECODE_PTR_ARGS` and the lists next to
it). ``manifest.json`` lists the kernels; the package's loader
(:mod:`oscar_kernels.cute.bundle`) reads it. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .bundle import BUNDLE_FORMAT, OPS, build_options
from .config import CTA_WARPS, HEAD_DIMS, Int2DecodeConfig


def _runtime_lib() -> str:
    import nvidia_cutlass_dsl  # the package that produced the object files

    base = os.path.dirname(list(nvidia_cutlass_dsl.__path__)[0] + "/")
    for flavour in ("cu13", "cu12"):
        path = os.path.join(base, flavour, "lib", "libcuda_dialect_runtime_static.a")
        if os.path.exists(path):
            return path
    raise FileNotFoundError("libcuda_dialect_runtime_static.a not found in nvidia_cutlass_dsl")


def _link(out_dir: str, name: str, cuda_home: str) -> str:
    """Wrap ``name.o`` (export_to_c) into ``lib<name>.so`` exporting ``<name>_load/_run``."""
    header = open(os.path.join(out_dir, name + ".h")).read()
    wrapper = f"cute_dsl_{name}_wrapper("
    start = header.index(wrapper) + len(wrapper)
    params = [p.strip() for p in header[start:header.index(")", start)].split(",")][1:]
    sig, call = [], []
    for p in params:
        ctype, pname = p.rsplit(" ", 1)
        if ctype == "cudaStream_t":
            sig.append(f"void *{pname}")
            call.append(f"(cudaStream_t){pname}")
        else:
            sig.append(p)
            call.append(pname)
    shim = os.path.join(out_dir, f"{name}_shim.c")
    with open(shim, "w") as f:
        f.write(f'#include "{name}.h"\nstatic {name}_Kernel_Module_t g_mod;\n'
                f"static int g_loaded = 0;\n"
                f"int {name}_load(void) {{\n  if (!g_loaded) {{ cudaGetLastError(); "
                f"{name}_Kernel_Module_Load(&g_mod); g_loaded = 1; }}\n"
                f"  return (int)cudaGetLastError();\n}}\n"
                f"int {name}_run({', '.join(sig)}) {{\n"
                f"  return cute_dsl_{name}_wrapper(&g_mod, {', '.join(call)});\n}}\n")
    vmap = os.path.join(out_dir, f".{name}.map")
    with open(vmap, "w") as f:
        f.write(f"{{ global: {name}_load; {name}_run; local: *; }};\n")
    lib = os.path.join(out_dir, f"lib{name}.so")
    cmd = ["gcc", "-O2", "-shared", "-fPIC", f"-I{cuda_home}/include", f"-I{out_dir}", shim,
           os.path.join(out_dir, name + ".o"), _runtime_lib(), f"-L{cuda_home}/lib64", "-lcudart",
           "-Wl,--no-undefined", f"-Wl,--version-script={vmap}", "-s", "-o", lib]
    subprocess.run(cmd, check=True)
    for path in (vmap, shim, os.path.join(out_dir, name + ".o"), os.path.join(out_dir, name + ".h")):
        os.remove(path)
    return lib


def build(out_dir: str, cuda_home: str, head_dims=HEAD_DIMS,
          variant: dict | None = None) -> dict:
    """Compile, export and link every kernel into ``out_dir``; return the manifest.
    ``variant``: ``Int2DecodeConfig`` fields set in every decode build (``debug``,
    ``k_operands``, ``rank_weights``: debug and measurement bundles; the manifest records
    the debug flags)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    if os.environ["CUTE_DSL_ARCH"] != "sm_90a":
        raise ValueError(f"CUTE_DSL_ARCH: expected sm_90a, got {os.environ['CUTE_DSL_ARCH']}")
    from .decode_sm90 import compile_decode
    from .merge_sm90 import compile_merge

    variant = dict(variant or {})

    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):          # a bundle holds exactly what its manifest lists
        if f.endswith(".so") or f == "manifest.json":
            os.remove(os.path.join(out_dir, f))
    kernels = {}
    for d in head_dims:
        for warps in CTA_WARPS:
            for op in OPS:   # every build of _bundle.build_options (the JIT mode's too)
                options = build_options(op, d, warps)
                if options is None:
                    continue
                c = Int2DecodeConfig(**options, **(variant if op != "merge" else {}))
                name = c.merge_name if op == "merge" else c.name
                (compile_merge if op == "merge" else compile_decode)(c).export_to_c(out_dir,
                                                                                    name)
                lib = _link(out_dir, name, cuda_home)
                kernels[name] = {"op": op, "head_dim": d, "library": os.path.basename(lib),
                                 "arch": "sm_90a", "warps": c.warps}
    from importlib.metadata import version

    manifest = {"bundle_format": BUNDLE_FORMAT, "cutlass_dsl": version("nvidia-cutlass-dsl"),
                "cuda_runtime": "libcudart.so.13", "kernels": kernels}
    if variant.get("debug"):
        manifest["debug"] = sorted(variant["debug"])
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oscar_kernels.cute.aot")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the kernels into a prebuilt bundle")
    b.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "prebuilt"))
    b.add_argument("--cuda", required=True, help="CUDA 13 toolkit root")
    b.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS))
    b.add_argument("--debug", default="",
                   help="comma-separated debug flags (config.DEBUG_FLAGS), e.g. trace,pro")
    b.add_argument("--k-operands", default=None, help="masked|unmasked|top for every build")
    b.add_argument("--rank-weights", default=None, help="W0/W: the wide build's split shares")
    a = ap.parse_args(argv)
    variant = {}
    if a.debug:
        variant["debug"] = frozenset(x for x in a.debug.split(",") if x)
    if a.k_operands:
        variant["k_operands"] = a.k_operands
    if a.rank_weights:
        variant["rank_weights"] = tuple(int(x) for x in a.rank_weights.split("/"))
    manifest = build(os.path.abspath(a.out), a.cuda, tuple(a.head_dims), variant)
    sys.stdout.write(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
