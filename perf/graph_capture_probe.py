"""What a CUDA graph of one CuTe decode call costs with and without a ticket buffer ready
for the capture stream.

``perf/harness.py``'s ``time_cuda`` (like ``torch.cuda.graph`` users in general) warms up
on other streams and captures on ``torch.cuda.graph``'s own stream; the decode's ticket
buffer is per stream (``oscar_kernels.cute._counters``). Without a spare buffer zeroed ahead
of time, the first call on the capture stream allocates one with ``torch.zeros`` *inside*
the capture, and every replay runs that fill before the decode. This times the call both
ways (``SPARE_TICKET_BUFFERS`` 0 vs the default), alternating rounds, and reports how many
ticket buffers exist afterwards.

    PYTHONPATH=. python3 perf/graph_capture_probe.py --model qwen3-8b --batch 1 8 --context 65536
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
    from oscar_kernels import CacheSpec, LayerRotation, cute, ops
    from oscar_kernels.cute.bench import MODELS, make_cache

    hq, h, d = MODELS[a.model]
    dev = torch.device("cuda")
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=16, kv_layout="HND")
    rot = LayerRotation.hadamard(d).to(dev)
    default = cute.SPARE_TICKET_BUFFERS
    for b in a.batch:
        for n in a.context:
            cache, table = make_cache(spec, b, n, dev)
            q = torch.randn(b, hq, d, dtype=torch.bfloat16, device=dev)
            out = torch.empty_like(q)

            def call():
                ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                           check_bounds=False)
            res = {0: [], default: []}
            bufs = {}
            for _ in range(a.rounds):
                for spares in (0, default):
                    cute._COUNTERS.clear()
                    cute._SPARES.clear()
                    cute.SPARE_TICKET_BUFFERS = spares
                    res[spares].append(1e3 * time_cuda(call, warmup=3, rep=30)["median_ms"])
                    bufs[spares] = len(cute._COUNTERS)
            cute.SPARE_TICKET_BUFFERS = default
            print(f"{a.model} batch {b} context {n}: " + " | ".join(
                f"spares {k}: " + " ".join(f"{t:.1f}" for t in v) + f" us ({bufs[k]} ticket "
                "buffers in use)" for k, v in res.items()), flush=True)
            del cache
    return 0


if __name__ == "__main__":
    sys.exit(main())
