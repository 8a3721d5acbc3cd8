"""What a CUDA graph of one CuTe decode call costs with and without its tickets zeroed
ahead of the capture.

A call captured into a graph takes its tickets from a per-device arena that the first eager
call zeroed (``oscar_kernels.cute.workspace._capture_tickets``). Without one, the capture zeroes a new arena with ``torch.zeros``
*inside* the graph, and every replay runs that fill before the decode. This times the call
both ways (``fill``: the arena dropped before each capture), alternating rounds.

    PYTHONPATH=. python3 perf/tools/graph_capture_probe.py --model qwen3-8b --batch 1 8 --context 65536
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--context", type=int, nargs="+", default=[65536])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    sys.path.insert(0, os.path.join(os.getcwd(), "perf"))
    import torch

    from harness import time_cuda
    from oscar_kernels import CacheSpec, LayerRotation, ops
    from oscar_kernels.cute import workspace
    from cute_bench import MODELS, make_cache

    hq, h, d = MODELS[a.model]
    dev = torch.device("cuda")
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=16, kv_layout="HND")
    rot = LayerRotation.hadamard(d).to(dev)
    ready = workspace._capture_tickets

    def fill(dev, index, n):              # no arena zeroed ahead: a memset node in the graph
        workspace._ARENAS.pop(index, None)
        return ready(dev, index, n)
    for b in a.batch:
        for n in a.context:
            cache, table = make_cache(spec, b, n, dev)
            q = torch.randn(b, hq, d, dtype=torch.bfloat16, device=dev)
            out = torch.empty_like(q)

            def call():
                ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                           check_bounds=False)
            res = {"ready": [], "fill": []}
            for _ in range(a.rounds):
                for name, fn in (("ready", ready), ("fill", fill)):
                    workspace._capture_tickets = fn
                    try:
                        res[name].append(1e3 * time_cuda(call, warmup=3, rep=30)["median_ms"])
                    finally:
                        workspace._capture_tickets = ready
            print(f"{a.model} batch {b} context {n}: " + " | ".join(
                f"{k}: " + " ".join(f"{t:.1f}" for t in v) + " us" for k, v in res.items()),
                flush=True)
            del cache
    return 0


if __name__ == "__main__":
    sys.exit(main())
