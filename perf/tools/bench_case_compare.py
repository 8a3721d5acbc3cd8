"""The same CuTe decode timed on perf/bench_decode.py's case and on perf/cute_bench.py's
case, in one process (qwen3-8b, batch 1, HND pages): which part of the setup makes the two
benchmarks differ at batch 1.

    PYTHONPATH=. python3 perf/tools/bench_case_compare.py --context 8192 131072

Columns (us, medians of CUDA-graph replays, cold L2): bench_decode's whole case;
cute_bench.py's case through ``ops`` and through ``cute.decode``; bench_decode's cache and page
table with cute_bench.py's rotation (Hadamard) and query; then bench_decode's cache with one
part swapped at a time: its query with the Hadamard rotation, cute_bench.py's query with its
random orthogonal rotation, its rotation materialized per head (no stride-0 expand), and
its query scaled by 1/8 and by 8.
"""

from __future__ import annotations

import argparse
import math
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, nargs="+", default=[8192, 131072])
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    sys.path.insert(0, os.path.join(os.getcwd(), "perf"))
    import torch

    from oscar_kernels import CacheSpec, LayerRotation, cute, ops
    from cute_bench import make_cache
    from perf.bench_decode import PRESETS, make_int2_case
    from perf.harness import time_cuda

    dev = torch.device("cuda")
    scale = 1 / math.sqrt(128)

    def us(fn, warmup=3):
        return 1e3 * time_cuda(fn, warmup=warmup, rep=30)["median_ms"]
    for ctx in a.context:
        case = make_int2_case(PRESETS["qwen3-8b"], 1, ctx, 16, kv_layout="HND")
        out = torch.empty_like(case["q"])
        table = (case["kv_indptr"], case["kv_indices"], case["kv_last_page_len"],
                 case["window_slots"])
        t_bd = us(lambda: cute.decode(case["q"], case["cache"], *table, case["rot_k"],
                                      case["rot_v"], scale, out=out))
        spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=16, kv_layout="HND")
        cache, table2 = make_cache(spec, 1, ctx, dev)
        rot = LayerRotation.hadamard(128).to(dev)
        q = torch.randn(1, 32, 128, dtype=torch.bfloat16, device=dev)
        out2 = torch.empty_like(q)
        t_ops = us(lambda: ops.paged_decode_attention(q, cache, *table2, rot, out=out2,
                                                      backend="cute", check_bounds=False), 5)
        rk, rv = rot.per_head(8)
        t_cb = us(lambda: cute.decode(q, cache, *table2, rk, rv, scale, out=out2))
        t_mix = us(lambda: cute.decode(q, case["cache"], *table, rk, rv, scale, out=out2))
        print(f"ctx {ctx}: bench_decode case {t_bd:.1f} us | cute_bench case via ops "
              f"{t_ops:.1f} us, via decode {t_cb:.1f} us | bench_decode cache + cute_bench "
              f"rotation/q {t_mix:.1f} us", flush=True)
        qb, rb = case["q"], case["rot_k"]
        rb_full = rb.contiguous()
        parts = {
            "bd q + Hadamard": (qb, rk, rv),
            "cb q + bd rotation": (q, rb, rb),
            "bd rotation per head": (qb, rb_full, rb_full),
            "bd q / 8": ((qb.float() / 8).to(qb.dtype), rb, rb),
            "bd q * 8": ((qb.float() * 8).to(qb.dtype), rb, rb),
        }
        cols = []
        for name, (qq, r1, r2) in parts.items():
            t = us(lambda: cute.decode(qq, case["cache"], *table, r1, r2, scale, out=out2))
            cols.append(f"{name} {t:.1f}")
        print(f"ctx {ctx}: " + " | ".join(cols), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
