"""One CuTe INT2 decode call on a synthetic cache, for Nsight Compute.

    ncu --clock-control none -k regex:'(?i)int2' --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats \\
        python3 perf/tools/ncu_decode_probe.py 128 131072 qwen3-8b HND

Arguments: batch, context, model (perf/cute_bench.py MODELS), page layout. Runs the
decode three times (the first compiles/loads; profile the second with --launch-skip 1).
"""

import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from oscar_kernels import CacheSpec, LayerRotation, ops  # noqa: E402
from cute_bench import MODELS, make_cache  # noqa: E402


def main(argv):
    b, n = int(argv[0]), int(argv[1])
    hq, h, d = MODELS[argv[2] if len(argv) > 2 else "qwen3-8b"]
    layout = argv[3] if len(argv) > 3 else "NHD"
    dev = torch.device("cuda")
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=16, kv_layout=layout)
    rot = LayerRotation.hadamard(d).to(dev)
    cache, table = make_cache(spec, b, n, dev)
    q = torch.randn(b, hq, d, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(q)
    for _ in range(3):
        ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                   check_bounds=False)
    torch.cuda.synchronize()
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1:])
