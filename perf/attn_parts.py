"""Per-layer parts of perf/bench_e2e.py's INT2 attention on one GPU: the quantize-append of
one new token per sequence, the decode attention, and both in one CUDA graph.

    PYTHONPATH=. python3 perf/attn_parts.py --batch 50 8 1 --context 100000

Qwen3-8B shape (32 query / 8 KV heads, head_dim 128, page 16, HND pages), a random
orthogonal rotation shared by the heads (as bench_e2e.py), ``ops`` with
``check_bounds=False``; times are medians of CUDA-graph replays with a cold L2
(perf/harness.py), printed in microseconds.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[50, 8, 1])
    ap.add_argument("--context", type=int, default=100000)
    ap.add_argument("--rep", type=int, default=20)
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    import torch

    from oscar_kernels import CacheSpec, LayerRotation, ops
    from oscar_kernels.cute.bench import make_cache
    from perf.harness import env_header, time_cuda

    dev = torch.device("cuda")
    print(env_header(), flush=True)
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=16, kv_layout="HND")
    gen = torch.Generator().manual_seed(0)
    rk = torch.linalg.qr(torch.randn(128, 128, generator=gen, dtype=torch.float64))[0].float()
    rot = LayerRotation(rk[None].to(dev), rk.T.contiguous()[None].to(dev))
    n = a.context
    for b in a.batch:
        cache, (indptr, indices, last, slots) = make_cache(spec, b, n, dev)
        q = torch.randn(b, 32, 128, dtype=torch.bfloat16, device=dev)
        k = torch.randn(b, 8, 128, dtype=torch.bfloat16, device=dev)
        v = torch.randn(b, 8, 128, dtype=torch.bfloat16, device=dev)
        bidx = torch.arange(b, dtype=torch.int32, device=dev)
        pos = torch.full((b,), n - 1, dtype=torch.int32, device=dev)
        out = torch.empty_like(q)

        def append():
            ops.quantize_append_paged_kv_cache(k, v, bidx, pos, cache, indices, indptr, last,
                                               slots, rot, check_bounds=False)

        def decode():
            ops.paged_decode_attention(q, cache, indptr, indices, last, slots, rot, out=out,
                                       check_bounds=False)

        def both():
            append()
            decode()
        t = {name: 1e3 * time_cuda(fn, warmup=3, rep=a.rep)["median_ms"]
             for name, fn in (("append", append), ("decode", decode), ("both", both))}
        print(f"batch {b} context {n}: append {t['append']:.1f} us, decode {t['decode']:.1f} "
              f"us, both {t['both']:.1f} us", flush=True)
        del cache
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
