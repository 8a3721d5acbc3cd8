"""Compare the SASS of two CuTe kernel bundles kernel by kernel.

A bundle (``python -m oscar_kernels.cute.aot build``) is a directory with ``manifest.json``
and one ``lib<name>.so`` per kernel; each library embeds its kernel's sm_90a cubin as plain
data. This script finds the cubin inside each library (the ELF image whose machine is
EM_CUDA), disassembles it with ``cuobjdump --dump-sass`` and compares the instruction
streams (opcodes, operands and the encoded words) and ``cuobjdump --dump-resource-usage``
(registers, stack, shared memory). Kernel symbol names are normalized: they carry the
Python module and class that emitted the kernel, which a file move changes without
changing the code. Needs no GPU and no CUDA DSL; only a ``cuobjdump`` (the CUDA toolkit's
or the one inside the triton wheel)::

    python perf/tools/sass_compare.py BUNDLE_A BUNDLE_B [--cuobjdump PATH] [--label-a ..]

Exit status 0 when every kernel listed by either manifest is present in both and
identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

EM_CUDA = 190
#: kernel symbols emitted by the CuTe DSL: kernel_cutlass_<module and class>_object_at_..._<n>
_SYMBOL = re.compile(r"kernel_cutlass_kernel_\w+")


def find_cuobjdump(explicit: str | None) -> str:
    """``explicit``, else ``cuobjdump`` on PATH, else the copy inside the triton wheel."""
    if explicit:
        return explicit
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError as exc:
        raise SystemExit("no cuobjdump: pass --cuobjdump PATH") from exc
    hits = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                                  "cuobjdump"))
    if not hits:
        raise SystemExit("no cuobjdump: pass --cuobjdump PATH")
    return hits[0]


def embedded_cubins(blob: bytes) -> list[bytes]:
    """The CUDA ELF images (cubins) stored inside a host library's bytes."""
    out, i = [], 0
    while True:
        i = blob.find(b"\x7fELF\x02\x01", i + 1)
        if i < 0:
            return out
        if struct.unpack_from("<H", blob, i + 18)[0] != EM_CUDA:
            continue
        phoff, shoff = struct.unpack_from("<QQ", blob, i + 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, i + 0x36)
        size = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
        out.append(blob[i:i + size])


def _cuobjdump(tool: str, flag: str, cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], check=True, capture_output=True,
                              text=True).stdout


def kernel_sass(tool: str, library: str) -> dict:
    """Normalized SASS and resource usage of the one cubin inside ``library``."""
    with open(library, "rb") as f:
        cubins = embedded_cubins(f.read())
    if len(cubins) != 1:
        raise ValueError(f"{library}: expected one embedded cubin, found {len(cubins)}")
    sass = _SYMBOL.sub("KERNEL", _cuobjdump(tool, "--dump-sass", cubins[0]))
    lines = [ln.rstrip() for ln in sass.splitlines() if ln.strip()]
    res = _SYMBOL.sub("KERNEL", _cuobjdump(tool, "--dump-resource-usage", cubins[0]))
    usage = " ".join(m.group(0) for m in re.finditer(r"(REG|STACK|SHARED|LOCAL):\d+", res))
    instr = [ln for ln in lines if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    text = "\n".join(lines)
    return {"sass": text, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
            "instructions": len(instr), "usage": usage}


def compare(a: str, b: str, tool: str) -> tuple[list[str], bool]:
    """Report lines and whether every kernel of either bundle is identical in the other."""
    man_a = json.load(open(os.path.join(a, "manifest.json")))["kernels"]
    man_b = json.load(open(os.path.join(b, "manifest.json")))["kernels"]
    rows, ok = [], True
    for name in sorted(set(man_a) | set(man_b)):
        if name not in man_a or name not in man_b:
            rows.append(f"{name:40s} MISSING in {'A' if name not in man_a else 'B'}")
            ok = False
            continue
        ka = kernel_sass(tool, os.path.join(a, man_a[name]["library"]))
        kb = kernel_sass(tool, os.path.join(b, man_b[name]["library"]))
        same = ka["sass"] == kb["sass"] and ka["usage"] == kb["usage"]
        ok &= same
        rows.append(f"{name:40s} {'IDENTICAL' if same else 'DIFFERENT'}  "
                    f"{ka['instructions']:6d} / {kb['instructions']:6d} instr  "
                    f"sha {ka['sha256']} / {kb['sha256']}  {ka['usage']}"
                    + ("" if ka["usage"] == kb["usage"] else f" / {kb['usage']}"))
    return rows, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle_a")
    ap.add_argument("bundle_b")
    ap.add_argument("--cuobjdump", default=None)
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args(argv)
    tool = find_cuobjdump(args.cuobjdump)
    rows, ok = compare(args.bundle_a, args.bundle_b, tool)
    print(f"A: {args.label_a} ({args.bundle_a})")
    print(f"B: {args.label_b} ({args.bundle_b})")
    print("kernel symbols normalized to KERNEL; SASS compared with encodings, resource usage "
          "from cuobjdump --dump-resource-usage")
    for row in rows:
        print(row)
    print(f"RESULT: {'all kernels identical' if ok else 'DIFFERENCES'} ({len(rows)} kernels)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
