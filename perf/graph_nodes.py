"""What one CuTe decode call puts into a CUDA graph when captured the way
perf/harness.py's ``time_cuda`` captures it (warm-up on the current and on a side stream,
then ``torch.cuda.graph`` on its own capture stream): the graph's nodes, from
``CUDAGraph.debug_dump``. A node besides the decode (and merge) kernel is time every
benchmark replay pays.

    PYTHONPATH=. python3 perf/graph_nodes.py --model qwen3-8b --batch 1 --context 65536
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=65536)
    ap.add_argument("--prealloc", action="store_true",
                    help="run one call on the capture stream before capturing")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    import torch

    from oscar_kernels import CacheSpec, LayerRotation, ops
    from oscar_kernels.cute.bench import MODELS, make_cache

    hq, h, d = MODELS[a.model]
    dev = torch.device("cuda")
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=16, kv_layout="HND")
    cache, table = make_cache(spec, a.batch, a.context, dev)
    rot = LayerRotation.hadamard(d).to(dev)
    q = torch.randn(a.batch, hq, d, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(q)

    def call():
        ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                   check_bounds=False)
    call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    g.enable_debug_mode()
    if a.prealloc:
        cap = torch.cuda.Stream()
        with torch.cuda.stream(cap):
            call()
        torch.cuda.synchronize()
        ctx = torch.cuda.graph(g, stream=cap)
    else:
        ctx = torch.cuda.graph(g)
    with ctx:
        call()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g.dot")
        g.debug_dump(path)
        text = open(path).read()
    labels = [re.sub(r"\s+", " ", ln)[:240] for ln in text.splitlines() if "label" in ln]
    print(f"{a.model} batch {a.batch} context {a.context} prealloc={a.prealloc}: "
          f"{len(labels)} labelled nodes; MEMSET in {sum('MEMSET' in x for x in labels)}, "
          f"KERNEL in {sum('KERNEL' in x for x in labels)}")
    for lab in labels:
        print("  ", lab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
