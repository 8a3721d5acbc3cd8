"""Where a decode step's quantize-append spends its time (one GPU, Qwen3-8B shape).

    PYTHONPATH=. python3 perf/tools/append_probe.py --batch 1 8 50

Times ``ops.quantize_append_paged_kv_cache`` (one new token per sequence, 8 KV heads,
head_dim 128, page 16, HND) as perf/tools/attn_parts.py does (CUDA-graph replay, cold L2,
medians; without the L2 flush between replays the GPU idles at a low clock and even an
empty kernel took 15-18 us), next to diagnostic variants of the Triton kernel built from its source with one
part changed (timing only, the results are wrong on purpose):

* ``nosort``  the clip threshold is the group maximum (no ``tl.sort``)
* ``norot``   no rotation: ``x' = x`` (no ``R`` loads, no products)
* ``warps=N`` the one-token programs with ``N`` warps instead of the shipped count
* ``kc=N``    the one-token programs' rotation in tiles of ``N`` rows of ``R``
* ``token=N`` one-token programs up to ``N`` programs per SM (shipped: 6; 0: always the
  16-token tiles)
* ``empty``   a Triton kernel with the same grid that does nothing (launch floor)

and, with ``--shared-rotation``/``--per-head-rotation``, one rotation for all heads (as
perf/tools/attn_parts.py) or one per head (a real layer: 8 x 2 x 64 KB of float32 ``R``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import tempfile

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "oscar_kernels", "triton", "quantize_append.py")

_PATCHES = {
    "nosort": [(r"srt = tl\.sort\(ax, dim=2\)", "srt = ax"),
               (r"tau = tl\.sum\(tl\.where\(ranks\[None, None, :\] == clip_idx, srt, 0\.0\), "
                r"axis=2\)", "tau = tl.max(ax, axis=2)")],
    "norot": [(r"xr \+= tl\.sum\(x\[:, :, None\] \* rot\[None, :, :\], axis=1\)",
               "xr = tl.load(xrow[:, None] + d[None, :], mask=rmask[:, None], "
               "other=0.0).to(tl.float32)")],
}


def variant(name: str):
    """The Triton append module with the named parts applied (``+``-separated: a patch
    name, ``warps=N``, ``kc=N``); a fresh file per variant, since Triton compiles from the
    source file."""
    src = open(_SRC).read()
    src = src.replace("from ..reference.quant", "from oscar_kernels.reference.quant")
    src = src.replace("from ._common", "from oscar_kernels.triton._common")
    subs = []
    for part in name.split("+"):
        if part in _PATCHES:
            subs += _PATCHES[part]
        elif part.startswith("warps="):
            subs.append((r"num_warps=8 if block_t > 1 else 4",
                         f"num_warps=8 if block_t > 1 else {int(part[6:])}"))
        elif part.startswith("kc="):
            subs.append((r"block_t, kc = append_plan\(nnz, h, d, append_key\.device\)",
                         "block_t, kc = append_plan(nnz, h, d, append_key.device)\n"
                         f"    kc = 16 if block_t > 1 else {int(part[3:])}"))
        elif part.startswith("token="):
            subs.append((r"TOKEN_PROGRAMS_PER_SM = 6 ",
                         f"TOKEN_PROGRAMS_PER_SM = {int(part[6:])} "))
        elif part != "shipped":
            raise ValueError(f"unknown variant part {part!r}")
    for pat, rep in subs:
        src, n = re.subn(pat, rep, src)
        if n != 1:
            raise RuntimeError(f"variant {name!r}: {pat!r} matched {n} times")
    d = tempfile.mkdtemp(prefix="append_probe_")
    path = os.path.join(d, f"qa_{re.sub(r'[^a-z0-9]', '_', name)}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 50])
    ap.add_argument("--context", type=int, default=100000)
    ap.add_argument("--rep", type=int, default=30)
    ap.add_argument("--variants", nargs="+",
                    default=["shipped", "kc=16", "kc=32", "kc=64", "warps=8", "kc=64+warps=2",
                             "nosort", "norot", "nosort+norot", "empty"])
    ap.add_argument("--rotations", nargs="+", default=["per-head", "shared"],
                    choices=["per-head", "shared"])
    a = ap.parse_args(argv)
    import torch
    import triton
    import triton.language as tl

    from oscar_kernels import CacheSpec, LayerRotation, ops
    from cute_bench import make_cache
    from oscar_kernels.reference.quant import clip_index  # noqa: F401
    from perf.harness import env_header, time_cuda

    @triton.jit
    def _empty(x_ptr, n):
        pass

    dev = torch.device("cuda")
    print(env_header(), flush=True)
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=16, kv_layout="HND")
    gen = torch.Generator().manual_seed(0)

    def orth():
        return torch.linalg.qr(torch.randn(128, 128, generator=gen, dtype=torch.float64))[0]

    rots = {}
    rk = orth().float()
    rots["shared"] = LayerRotation(rk[None].to(dev), rk.T.contiguous()[None].to(dev))
    per = torch.stack([orth().float() for _ in range(8)])
    per_v = torch.stack([orth().float() for _ in range(8)])
    rots["per-head"] = LayerRotation(per.to(dev), per_v.to(dev))
    mods = {}
    for v in a.variants:
        if v not in ("shipped", "empty"):
            mods[v] = variant(v)
    for b in a.batch:
        cache, (indptr, indices, last, slots) = make_cache(spec, b, a.context, dev)
        k = torch.randn(b, 8, 128, dtype=torch.bfloat16, device=dev)
        v_ = torch.randn(b, 8, 128, dtype=torch.bfloat16, device=dev)
        bidx = torch.arange(b, dtype=torch.int32, device=dev)
        pos = torch.full((b,), a.context - 1, dtype=torch.int32, device=dev)
        for rname in a.rotations:
            rot = rots[rname]
            rk_, rv_ = rot.per_head(8)
            for name in a.variants:
                if name == "shipped":
                    def fn():
                        ops.quantize_append_paged_kv_cache(k, v_, bidx, pos, cache, indices,
                                                           indptr, last, slots, rot,
                                                           check_bounds=False)
                elif name == "empty":
                    def fn():
                        _empty[(b, 8, 2)](k, b, num_warps=4)
                else:
                    mod = mods[name]

                    def fn(mod=mod):
                        mod.quantize_append_paged_kv_cache_triton(
                            cache, k, v_, bidx, pos, indices, indptr, last, slots, rk_, rv_,
                            float(rot.k_clip), float(rot.v_clip))
                t = time_cuda(fn, warmup=3, rep=a.rep)["median_ms"] * 1e3
                print(f"batch {b:3d} rot {rname:8s} {name:14s} {t:7.2f} us", flush=True)
        del cache
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
