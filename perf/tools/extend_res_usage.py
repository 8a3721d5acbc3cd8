"""Registers and spill stack of the Triton extend's INT2 part kernel, compiled on the CPU.

    PYTHONPATH=. python perf/tools/extend_res_usage.py

Compiles ``_extend_int2_kernel`` (oscar_kernels.triton.paged_extend) for sm_90a without
a GPU (``triton.compile`` with a CUDA target; Triton's bundled ptxas) for head_dim 64 / 128 /
256, its whole-row and quarter dots and two key-block sizes (4 warps, 2 stages, 64 rows),
and prints ``cuobjdump -res-usage`` (Triton's bundled copy) and the shared memory the
launch asks for. No timing: what spills is a place to look, not a verdict.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

POINTERS = {"qr_ptr": "*fp32", "k_codes": "*u8", "v_codes": "*u8", "k_params": "*fp16",
            "v_params": "*fp16", "qo_indptr": "*i32", "kv_indptr": "*i32",
            "kv_indices": "*i32", "kv_last": "*i32", "part_o": "*fp32", "part_ml": "*fp32"}


def usage(d: int, gqa: int, block_n: int, whole: bool, warps: int = 4, stages: int = 2):
    """(shared bytes, cuobjdump's resource line) of one compiled configuration."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from oscar_kernels.triton import paged_extend as pe

    fn = pe._extend_int2_kernel
    gp = triton.next_power_of_2(gqa)
    const = dict(PAGE_SIZE=16, SINK=64, RECENT=256, D=d, GQA=gqa, GP=gp, NG=1,
                 BLOCK_Q=max(1, pe.EXTEND_INT2_BLOCK_M // gp), BLOCK_N=block_n, DOT16=True,
                 UNPACK=pe.EXTEND_INT2_UNPACK, WHOLE=whole)
    sig = {n: ("constexpr" if n in const else POINTERS.get(n, "i64")) for n in fn.arg_names}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(k.asm["cubin"])
        out = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    line = next((ln.strip() for ln in out.splitlines() if "REG:" in ln), out.strip())
    return k.metadata.shared, line


def main() -> int:
    for d, gqa in ((64, 8), (128, 4), (256, 4)):
        for whole, block_n in ((True, 128), (True, 64), (False, 64)):
            shared, line = usage(d, gqa, block_n, whole)
            print(f"head_dim {d} gqa {gqa} {'whole-row' if whole else 'quarter'} dots, "
                  f"64 x {block_n}: launch shared {shared} B; {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
