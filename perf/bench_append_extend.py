"""INT2 cache writes: the decode-step append and one extend (chunked prefill) shape.

One run on one GPU, Qwen3-8B KV geometry (8 KV heads, head_dim 128, page 16, group 128,
sink 64 + recent 256):

* **append**: ``ops.quantize_append_paged_kv_cache`` of one new token per sequence (what
  every layer of every decode step runs), batch {1, 8, 32}, ``check_bounds=False`` as in
  a captured decode step; Triton backend with its default (one token per program at
  the grid small enough, ``append_plan``) and with the 16-token tile forced, beside the BF16 cache write a
  BF16 server does (``index_copy_`` of K and V into ``[pages·16, H, D]``). Median of
  CUDA-graph replays, cold L2 (:mod:`perf.harness`), and the number of kernels one call
  launches (torch profiler).
* **extend**: ``ops.paged_extend_attention`` (Triton) for ``--extend-batch`` sequences each
  appending ``--extend-chunk`` tokens onto ``--extend-prefix`` cached tokens. The launcher
  reads ``max`` chunk length on the host, so this is timed eagerly (CUDA events around
  each call, cold L2).

Bytes (append): the new K/V rows read (bf16) + the INT2 codes/params written + the BF16
window rows written (sink/ring; one ring row per token at these positions) + the
rotations read once (L2 across programs, counted once).

    PYTHONPATH=. python perf/bench_append_extend.py --out-dir perf/results

Results: ``perf/results/<date>_<gpu>_triton_append_extend.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import env_header, markdown_table, profile_kernels, tbps, write_results  # noqa: E402
from harness import time_cuda as _time_cuda  # noqa: E402


def time_cuda(fn, **kw):
    """``harness.time_cuda``; on the CPU (``--device cpu`` smoke run) one untimed call."""
    if DEV != "cuda":
        fn()
        return {"median_ms": float("nan"), "mode": "cpu-smoke"}
    return _time_cuda(fn, **kw)


DEV = "cuda"


def count_kernels(fn, iters: int = 5) -> tuple[float, dict]:
    """Kernels launched per call of ``fn`` and their names (torch profiler, eager)."""
    if DEV != "cuda":
        fn()
        return 0.0, {}
    names = {k: n for k, (n, _) in profile_kernels(fn, iters, name_len=80).items()}
    return sum(names.values()), names


def make_cache(batch, ctx, gen_seed=0):
    from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation

    h, d, ps = 8, 128, 16
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=ps)
    pages_per = math.ceil(ctx / ps)
    cache = Int2PagedKVCache.allocate(spec, batch * pages_per, batch, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(gen_seed)
    for codes in (cache.k_codes, cache.v_codes):
        codes.view(-1).copy_(torch.randint(0, 256, (codes.numel(),), device=DEV,
                                           dtype=torch.int32, generator=g).to(torch.uint8))
    for params in (cache.k_params, cache.v_params):
        scale = torch.rand(params.shape[:-1], device=DEV, generator=g) * 0.08 + 0.02
        params[..., 0] = scale.to(params.dtype)
        params[..., 1] = (-1.5 * scale).to(params.dtype)
    for w in (cache.k_window, cache.v_window):
        w.copy_(torch.randn(w.shape, device=DEV, generator=g).to(torch.bfloat16))
    indices = torch.randperm(batch * pages_per, device=DEV, generator=g).to(torch.int32)
    indptr = torch.arange(batch + 1, device=DEV, dtype=torch.int32) * pages_per
    last = torch.full((batch,), ctx - (pages_per - 1) * ps, dtype=torch.int32, device=DEV)
    slots = torch.arange(batch, dtype=torch.int32, device=DEV)
    qr = [torch.linalg.qr(torch.randn(d, d, device=DEV, generator=g, dtype=torch.float64))[0]
          for _ in range(2)]
    rot = LayerRotation(qr[0].to(torch.float32).contiguous()[None],
                        qr[1].to(torch.float32).contiguous()[None], 0.95, 0.95)
    return dict(spec=spec, cache=cache, kv_indptr=indptr, kv_indices=indices,
                kv_last_page_len=last, window_slots=slots, rot=rot, g=g)


def bench_append(batch, ctx, args):
    from oscar_kernels import ops
    from oscar_kernels.triton import quantize_append as qa

    c = make_cache(batch, ctx)
    spec, g = c["spec"], c["g"]
    h, d = spec.num_kv_heads, spec.head_dim
    k = torch.randn(batch, h, d, device=DEV, generator=g).to(torch.bfloat16)
    v = torch.randn(batch, h, d, device=DEV, generator=g).to(torch.bfloat16)
    bi = torch.arange(batch, dtype=torch.int32, device=DEV)
    pos = torch.full((batch,), ctx - 1, dtype=torch.int32, device=DEV)
    tab = (c["kv_indices"], c["kv_indptr"], c["kv_last_page_len"], c["window_slots"])

    def append():
        ops.quantize_append_paged_kv_cache(k, v, bi, pos, c["cache"], *tab, c["rot"],
                                           backend="triton", check_bounds=False)

    row = dict(op="append", batch=batch, context=ctx, nnz=batch)
    row["bytes"] = batch * (2 * h * d * 2 + 2 * h * (spec.packed_dim + spec.num_groups * 4)
                            + 2 * h * d * 2) + 2 * d * d * 4
    row["triton_ms"] = time_cuda(append, warmup=args.warmup, rep=args.rep)["median_ms"]
    row["launches"], row["kernels"] = count_kernels(append)
    saved = qa.TOKEN_PROGRAMS_PER_SM
    qa.TOKEN_PROGRAMS_PER_SM = 0                        # force the 16-token tile path
    try:
        row["triton_tile16_ms"] = time_cuda(append, warmup=args.warmup, rep=args.rep)["median_ms"]
    finally:
        qa.TOKEN_PROGRAMS_PER_SM = saved
    row["triton_TBps"] = tbps(row["bytes"], row["triton_ms"])
    # BF16 server's write of the same tokens: index_copy_ of K and V rows into the pages
    kp = torch.randn(batch * math.ceil(ctx / 16) * 16, h, d, device=DEV,
                     generator=g).to(torch.bfloat16)
    vp = torch.empty_like(kp)
    slot_ids = (torch.arange(batch, device=DEV) * math.ceil(ctx / 16) * 16 + ctx - 1)

    def bf16_write():
        kp.index_copy_(0, slot_ids, k)
        vp.index_copy_(0, slot_ids, v)

    row["bf16_index_copy_ms"] = time_cuda(bf16_write, warmup=args.warmup, rep=args.rep)["median_ms"]
    del c, kp, vp
    torch.cuda.empty_cache()
    return row


def bench_extend(args):
    from oscar_kernels import ops

    batch, prefix, chunk = args.extend_batch, args.extend_prefix, args.extend_chunk
    ctx = prefix + chunk
    c = make_cache(batch, ctx, gen_seed=3)
    spec, g = c["spec"], c["g"]
    h, d, hq = spec.num_kv_heads, spec.head_dim, 32
    nnz = batch * chunk
    q = torch.randn(nnz, hq, d, device=DEV, generator=g).to(torch.bfloat16)
    k = torch.randn(nnz, h, d, device=DEV, generator=g).to(torch.bfloat16)
    v = torch.randn(nnz, h, d, device=DEV, generator=g).to(torch.bfloat16)
    qo = torch.arange(batch + 1, dtype=torch.int32, device=DEV) * chunk
    out = torch.empty_like(q)
    tab = (c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"], c["window_slots"])

    def extend():
        ops.paged_extend_attention(q, k, v, qo, c["cache"], *tab, c["rot"], out=out,
                                   backend="triton", check_bounds=False)

    r = time_cuda(extend, warmup=args.warmup, rep=args.rep, graph=False)
    row = dict(op="extend", batch=batch, context=ctx, nnz=nnz, prefix=prefix, chunk=chunk,
               triton_ms=r["median_ms"], mode=r["mode"])
    row["launches"], row["kernels"] = count_kernels(extend)
    # attention FLOPs (causal within the chunk, full over the prefix), 2 GEMMs
    row["tflops"] = (4 * hq * d * batch * (chunk * prefix + chunk * (chunk + 1) / 2)
                     / (r["median_ms"] * 1e-3) / 1e12)
    del c
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--extend-batch", type=int, default=4)
    p.add_argument("--extend-prefix", type=int, default=4096)
    p.add_argument("--extend-chunk", type=int, default=512)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rep", type=int, default=30)
    p.add_argument("--stem", default=None)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--device", default="cuda",
                   help="cpu: smoke run under TRITON_INTERPRET=1 (one call each, no timing)")
    args = p.parse_args(argv)
    global DEV
    DEV = args.device
    header = env_header()
    print(f"[env] {header}", flush=True)
    rows = []
    for batch in (int(x) for x in args.batches.split(",")):
        rows.append(bench_append(batch, args.context, args))
        print(f"[row] {rows[-1]}", flush=True)
    try:
        rows.append(bench_extend(args))
    except Exception as exc:  # noqa: BLE001 - keep the append rows that were measured
        rows.append(dict(op="extend", batch=args.extend_batch, error=f"{type(exc).__name__}: "
                         f"{str(exc)[:300]}"))
        torch.cuda.empty_cache()
    print(f"[row] {rows[-1]}", flush=True)
    cols = [("op", "op", ""), ("batch", "B", ""), ("context", "ctx", ""), ("nnz", "new tokens", ""),
            ("triton_ms", "Triton ms", ".4f"), ("launches", "kernels/call", ".0f"),
            ("triton_tile16_ms", "Triton 16-token tile ms", ".4f"),
            ("bf16_index_copy_ms", "BF16 index_copy_ ms", ".4f"),
            ("triton_TBps", "Triton TB/s", ".3f"), ("tflops", "extend TFLOP/s", ".1f"),
            ("error", "error", "")]
    md = ("Append: one token per sequence (a decode step), median of CUDA-graph replays, cold "
          "L2. Extend: eager (host read of the chunk lengths), cold L2. Kernel names per call "
          "in the JSON.\n\n" + markdown_table(rows, cols))
    gpu = header.get("gpu", "gpu").replace(" ", "_").lower()
    stem = args.stem or f"{_dt.date.today().isoformat()}_{gpu}_triton_append_extend"
    paths = write_results(stem, header, {"rows": rows, "args": vars(args)}, md, args.out_dir)
    print(md)
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
