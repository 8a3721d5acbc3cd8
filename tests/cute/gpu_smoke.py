"""Diagnostic run of the CuTe decode kernel vs the reference (prints relative errors per
config: window-only, INT2-only, mixed). ``PYTHONPATH=. python tests/cute/gpu_smoke.py``."""

import sys
import os
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from test_cute_gpu import _fill, reference_decode  # noqa: E402

from oscar_kernels import CacheSpec, ops  # noqa: E402


def run(label, spec, lens, gqa, seed=0):
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(seed)
    cache, table, rot, q = _fill(spec, lens, gen, spec.num_kv_heads * gqa, dev)
    scale = spec.head_dim ** -0.5
    ref, ref_lse, yard = reference_decode(cache, table, rot, q, scale)
    out = torch.full_like(q, float("nan"))
    got, lse = ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                          return_lse=True)
    torch.cuda.synchronize()
    got, lse = got.cpu().float(), lse.cpu()
    for b, n in enumerate(lens):
        e = float((got[b].double() - ref[b].double()).norm() / ref[b].double().norm().clamp_min(1e-30))
        y = float((yard[b].double() - ref[b].double()).norm() / ref[b].double().norm().clamp_min(1e-30))
        dl = float((lse[b] - ref_lse[b]).abs().max())
        print(f"{label:28s} L={n:6d} rel_err={e:.2e} bf16_yard={y:.2e} lse_diff={dl:.2e} "
              f"nan={int(torch.isnan(got[b]).sum())}", flush=True)


if __name__ == "__main__":
    t = time.time()
    for d in (128, 64):
        run(f"d{d} window-only", CacheSpec(num_kv_heads=2, head_dim=d, page_size=16), [5, 100, 320], 4)
        run(f"d{d} int2-only", CacheSpec(num_kv_heads=2, head_dim=d, page_size=16, sink_size=0,
                                        recent_size=0), [16, 37, 1000], 4)
        run(f"d{d} mixed gqa8 p64 HND", CacheSpec(num_kv_heads=1, head_dim=d, page_size=64,
                                                  kv_layout="HND"), [321, 5000], 8)
        run(f"d{d} mixed gqa1", CacheSpec(num_kv_heads=3, head_dim=d, page_size=32), [400, 2000], 1)
    print("smoke done in", time.time() - t)
