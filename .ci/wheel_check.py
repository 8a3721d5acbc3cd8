"""Check an installed (not editable) oscar-kernels from outside the source tree.

Run by .ci/wheel_check.sh with the Python of a virtualenv that has the wheel installed:

* ``oscar_kernels`` resolves to that environment's site-packages, not to a source tree;
* every CuTe bundle in the package (``prebuilt/manifest.json``) ships with every library
  its manifest lists, and the calibration texts ship too;
* ``import oscar_kernels`` works and a CPU reference op runs: quantize-append 20 tokens,
  then decode, equal to plain softmax attention (20 tokens lie in the BF16 windows).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys


def check_location(pkg_dir: str, source: str | None) -> None:
    prefix = os.path.realpath(sys.prefix)
    real = os.path.realpath(pkg_dir)
    if not real.startswith(prefix + os.sep):
        sys.exit(f"oscar_kernels at {real} is not inside this environment ({prefix})")
    if source and real.startswith(os.path.realpath(source) + os.sep):
        sys.exit(f"oscar_kernels at {real} is the source tree, not the installed wheel")


def check_package_data(pkg_dir: str) -> None:
    manifests = glob.glob(os.path.join(pkg_dir, "**", "prebuilt", "manifest.json"),
                          recursive=True)
    if not manifests:
        sys.exit("no CuTe bundle (prebuilt/manifest.json) in the installed package")
    for mf in manifests:
        with open(mf) as f:
            kernels = json.load(f)["kernels"]
        missing = [k["library"] for k in kernels.values()
                   if not os.path.isfile(os.path.join(os.path.dirname(mf), k["library"]))]
        if missing:
            sys.exit(f"{mf} lists libraries the wheel does not ship: {missing}")
        print(f"bundle {os.path.relpath(mf, pkg_dir)}: {len(kernels)} kernels, all shipped")
    texts = glob.glob(os.path.join(pkg_dir, "calibration", "texts", "*.txt"))
    if not texts:
        sys.exit("the calibration texts are missing from the installed package")
    print(f"calibration texts: {len(texts)}")


def check_reference_op() -> None:
    import torch

    from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation, ops

    torch.manual_seed(0)
    n, h, hq, d = 20, 2, 4, 64
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=16)
    cache = Int2PagedKVCache.allocate(spec, num_pages=4, num_window_slots=1)
    rot = LayerRotation.hadamard(d)

    def i32(*x):
        return torch.tensor(x, dtype=torch.int32)

    kv_indptr, kv_indices, kv_last_page_len, window_slots = i32(0, 2), i32(3, 1), i32(4), i32(0)
    k, v = torch.randn(2, n, h, d, dtype=torch.bfloat16)
    ops.quantize_append_paged_kv_cache(k, v, torch.zeros(n, dtype=torch.int32),
                                       torch.arange(n, dtype=torch.int32), cache, kv_indices,
                                       kv_indptr, kv_last_page_len, window_slots, rot,
                                       backend="reference")
    q = torch.randn(1, hq, d, dtype=torch.bfloat16)
    o = ops.paged_decode_attention(q, cache, kv_indptr, kv_indices, kv_last_page_len,
                                   window_slots, rot, backend="reference")
    kk = k.float().repeat_interleave(hq // h, dim=1)             # [n, hq, d]
    vv = v.float().repeat_interleave(hq // h, dim=1)
    p = torch.softmax(torch.einsum("hd,nhd->hn", q[0].float(), kk) / d ** 0.5, dim=-1)
    want = torch.einsum("hn,nhd->hd", p, vv)
    err = (o[0].float() - want).abs().max().item()
    if not err < 3e-2:
        sys.exit(f"reference decode differs from softmax attention by {err}")
    print(f"reference append + decode: max abs error {err:.2e} against softmax attention")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", help="the source tree the wheel was built from")
    a = ap.parse_args()
    spec = importlib.util.find_spec("oscar_kernels")
    if spec is None or spec.origin is None:
        sys.exit("oscar_kernels is not installed in this environment")
    pkg_dir = os.path.dirname(spec.origin)
    check_location(pkg_dir, a.source)
    check_package_data(pkg_dir)
    check_reference_op()
    print(f"wheel check passed: {pkg_dir}")


if __name__ == "__main__":
    main()
