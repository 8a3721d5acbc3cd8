"""SASS report of the CuTe decode kernels, built for sm_90a on a machine without a GPU.

    CUTE_DSL_ARCH=sm_90a python perf/sass_report.py --head-dims 128 64

(the Python that has ``nvidia-cutlass-dsl``, see docs/cute-design.md; ``cuobjdump`` from the CUDA
toolkit or from triton's wheel). Per kernel: registers and stack (``cuobjdump
-res-usage``), the instruction total, the counts the design relies on (IMMA / HMMA /
LDSM / LDGSTS / UTMALDG, spills), and for the decode kernels every loop that copies and
multiplies (``mma_loops``: length and spills each; the merge-CTA build has two, its merge
tail's and the INT2 loop) and the INT2 main loop (the shortest of them): its length and the
instructions one warp executes per 16-token chunk on the fast path.

The fast path is found by walking the loop body from its head: the first conditional
branch that jumps far ahead (more than ``SPLIT_BYTES``: the masked-chunk path) is not
taken, short forward conditional branches (less than ``SKIP_BYTES``: the page-row refresh
block, the running-max rescale) are taken, unconditional branches are followed, and the
walk ends at the loop's back edge. Each iteration handles two chunks, so the count is
halved. These are the numbers quoted as "SASS per chunk" in the module docstring of
``oscar_kernels/cute/decode_sm90.py`` and in docs/cute-design.md.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SPLIT_BYTES = 0x1000
SKIP_BYTES = 0x600
_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"BRA\s+(?:`?\(?)?(0x[0-9a-f]+)")
_PRED = re.compile(r"^@!?U?P\w+\s+")


def parse_sass(text: str) -> list[tuple[int, str]]:
    """``(address, instruction)`` of every SASS line of ``cuobjdump -sass`` output."""
    out = []
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(ins: str) -> str:
    """The base opcode (``IMAD`` of ``@!P0 IMAD.SHL.U32 R1, ...``)."""
    return _PRED.sub("", ins).split()[0].split(".")[0]


def _target(ins: str):
    m = _BRANCH.search(ins)
    if m is None or "BRA.DIV" in ins:
        return None
    return int(m.group(1), 16)


def loops(instrs: list[tuple[int, str]], min_len: int = 30) -> list[tuple[int, int]]:
    """``(head, back edge)`` addresses of the backward branches spanning ``min_len`` or more
    instructions, in address order."""
    index = {a: i for i, (a, _) in enumerate(instrs)}
    found = []
    for i, (a, ins) in enumerate(instrs):
        t = _target(ins)
        if t is not None and t < a and t in index and i - index[t] + 1 >= min_len:
            found.append((t, a))
    return found


def main_loop(instrs: list[tuple[int, str]]):
    """The INT2 main loop: the innermost loop that issues cp.async copies (LDGSTS) and runs
    tensor-core MMAs."""
    index = {a: i for i, (a, _) in enumerate(instrs)}
    best = None
    for lo, hi in loops(instrs):
        ops = collections.Counter(opcode(x) for _, x in instrs[index[lo]:index[hi] + 1])
        if ops["LDGSTS"] and ops["HMMA"] + ops["IMMA"]:
            if best is None or index[hi] - index[lo] < index[best[1]] - index[best[0]]:
                best = (lo, hi)
    return best


def fast_path(instrs: list[tuple[int, str]], lo: int, hi: int) -> list[str]:
    """The instructions of one iteration of the loop ``[lo, hi]`` on its fast path (see the
    module docstring for the walk)."""
    index = {a: i for i, (a, _) in enumerate(instrs)}
    i, seq, split_seen = index[lo], [], False
    while i < len(instrs) and instrs[i][0] <= hi:
        a, ins = instrs[i]
        seq.append(ins)
        t = _target(ins)
        if t is not None:
            if t < a:
                break
            if ins.startswith("@"):
                if not split_seen and t - a > SPLIT_BYTES:
                    split_seen = True
                elif t - a < SKIP_BYTES:
                    i = index[t]
                    continue
            else:
                i = index[t]
                continue
        i += 1
    return seq


KEY_OPS = ("IMMA", "HMMA", "LDSM", "LDGSTS", "UTMALDG", "HGMMA", "STL", "LDL", "ATOMG")


def report(cubin: str, cuobjdump: str, name: str, decode: bool) -> dict:
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    res = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True,
                         check=True).stdout
    instrs = parse_sass(sass)
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    ops = collections.Counter(opcode(x) for _, x in instrs)
    row = {"kernel": name, "registers": int(regs.group(1)) if regs else None,
           "stack_bytes": int(stack.group(1)) if stack else None, "sass": len(instrs),
           **{op: ops[op] for op in KEY_OPS}}
    if decode:
        index = {a: i for i, (a, _) in enumerate(instrs)}
        # every loop that copies and multiplies: (SASS, spills) each
        row["mma_loops"] = []
        for lo, hi in loops(instrs):
            body = instrs[index[lo]:index[hi] + 1]
            bops = collections.Counter(opcode(x) for _, x in body)
            if bops["LDGSTS"] and bops["HMMA"] + bops["IMMA"]:
                row["mma_loops"].append((len(body), bops["STL"] + bops["LDL"]))
        loop = main_loop(instrs)
        if loop is not None:
            body = instrs[index[loop[0]]:index[loop[1]] + 1]
            fast = fast_path(instrs, *loop)
            fops = collections.Counter(opcode(x) for x in fast)
            row.update(main_loop_sass=len(body),
                       main_loop_spills=sum(opcode(x) in ("STL", "LDL") for _, x in body),
                       fast_path_per_chunk=len(fast) / 2,
                       fast_path_ops={k: v / 2 for k, v in fops.most_common()},
                       fast_path=fast)
    return row


def _cuobjdump(path: str | None) -> str:
    if path:
        return path
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton

        cand = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                            "cuobjdump")
        if os.path.exists(cand):
            return cand
    except ImportError:
        pass
    raise SystemExit("cuobjdump not found: pass --cuobjdump")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--kernels", nargs="+",
                    default=["decode_pair", "decode", "decode_pair_w8", "decode_w8", "merge"],
                    choices=["decode_pair", "decode", "decode_pair_w8", "decode_w8", "merge",
                             "decode_pair_anypage", "decode_anypage", "decode_pair_mc_w8",
                             "decode_pair_ring4", "decode_pair_ring4_w8"],
                    help="*_w8: CTAs of 8 warps (head_dim 128 only; skipped at other dims); "
                         "*_anypage: the build for pages that are not a multiple of 16; "
                         "decode_pair_mc_w8: the merge-CTA build; decode_pair_ring4*: the "
                         "pair kernel with a 4-deep ring")
    ap.add_argument("--cuobjdump", default=None)
    ap.add_argument("--dump-fast", default=None, metavar="DIR",
                    help="also write each decode kernel's fast-path listing (one iteration, "
                         "registers stripped) to DIR/<kernel>.txt, for diffing two trees")
    a = ap.parse_args(argv)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    tool = _cuobjdump(a.cuobjdump)
    dump = tempfile.mkdtemp(prefix="sass_report_")
    # read by the DSL when it is imported: set before the kernels module pulls it in
    os.environ["CUTE_DSL_KEEP"] = "cubin"
    os.environ["CUTE_DSL_DUMP_DIR"] = dump
    sys.path.insert(0, os.getcwd())
    from oscar_kernels.cute.config import Int2DecodeConfig
    from oscar_kernels.cute.decode_sm90 import compile_decode
    from oscar_kernels.cute.merge_sm90 import compile_merge

    try:
        for d in a.head_dims:
            for kind in a.kernels:
                warps = 8 if kind.endswith("_w8") else 4
                if warps == 8 and d != 128:
                    continue
                start = time.time()
                cfg = Int2DecodeConfig(d, pair=kind.startswith("decode_pair"), warps=warps,
                                       any_page=kind.endswith("_anypage"),
                                       merge_ctas="_mc" in kind,
                                       stages=4 if "_ring4" in kind else 0)
                (compile_merge if kind == "merge" else compile_decode)(cfg)
                new = sorted((f for f in glob.glob(os.path.join(dump, "**", "*.cubin"),
                                                   recursive=True)
                              if os.path.getmtime(f) >= start - 1), key=os.path.getmtime)
                if not new:
                    raise SystemExit(f"no cubin kept for {kind} d{d} (CUTE_DSL_KEEP=cubin "
                                     "had no effect?)")
                row = report(new[-1], tool, f"{kind}_d{d}", kind != "merge")
                fast = row.pop("fast_path_ops", None)
                listing = row.pop("fast_path", None)
                if a.dump_fast and listing:
                    os.makedirs(a.dump_fast, exist_ok=True)
                    with open(os.path.join(a.dump_fast, f"{kind}_d{d}.txt"), "w") as f:
                        f.write("\n".join(listing) + "\n")
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                if fast:
                    print("  fast path per chunk: "
                          + ", ".join(f"{k} {v:g}" for k, v in fast.items()), flush=True)
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
