"""Prefill (extend) attention: INT2 paged extend against the best BF16 prefill kernels.

    PYTHONPATH=. python3 perf/bench_prefill.py --fi-site /tmp/fi_site --out perf/results

Qwen3-8B geometry (32 query / 8 KV heads, head_dim 128). Each case appends ``chunk``
tokens to ``prefix`` cached tokens for each of ``batch`` sequences and attends causally
(query at position ``t`` sees ``t + 1`` keys). In one run, per case:

* ``int2``: ``ops.paged_extend_attention`` (``backend="triton"``, what ``auto`` runs for
  extend) on an INT2 cache (page 16, HND, one scale/zero group per token, default sink 64
  and recent 256). The op also writes the chunk into the cache (INT2 pages and BF16
  window rows) and reads the page table on the host; eager calls.
  ``--int2-paths`` times each INT2-part path: ``dense`` (dequantize + torch cuDNN
  attention), ``kernel`` (``_extend_int2_kernel``) and ``one`` (one kernel for all keys).
* ``cudnn_bf16``: torch's cuDNN attention (``_scaled_dot_product_cudnn_attention``) on
  contiguous BF16 K/V, the GQA heads expanded beforehand (untimed). Torch offers only a
  top-left causal mask, so with a prefix the case runs as two calls: the chunk against
  the prefix without a mask, and against itself with the causal mask; their outputs are
  not merged, so this time is a lower bound of a bottom-right cuDNN call.
* ``flash_bf16``: torch's flash attention backend with ``causal_lower_right`` (one call).
* ``flashinfer_bf16``: FlashInfer 0.7.2 ``BatchPrefillWithPagedKVCacheWrapper`` (fa2,
  page 16, HND, causal) when ``--fi-site`` points at an unpacked
  ``../shared/baselines/flashinfer`` (``setup_site.py``); CUDA-graph replay.

CUDA events, warm-up, median of ``--rep`` calls, cold L2 (perf/harness.py). TFLOP/s count
4 flops per (query head, visible key, channel). Writes ``<date>_<gpu>_bench_prefill.json``
(rows with ``prefix``, ``chunk``, ``batch``, ``int2_ms``, ``cudnn_bf16_ms``,
``flash_bf16_ms``, ``flashinfer_bf16_ms``) and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

HQ, HKV, D, PAGE = 32, 8, 128, 16
BATCH1 = [(1, p, c) for c in (512, 4096, 16384) for p in (0, 4096, 28672, 61440, 126976)]
CASES = BATCH1 + [(8, 32768, 1024)]


def causal_flops(batch: int, prefix: int, chunk: int) -> float:
    keys = chunk * prefix + chunk * (chunk + 1) // 2
    return 4.0 * batch * keys * HQ * D


def int2_call(batch: int, prefix: int, chunk: int):
    import torch

    from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation, ops

    spec = CacheSpec(num_kv_heads=HKV, head_dim=D, page_size=PAGE, kv_layout="HND")
    ctx = prefix + chunk
    pages_per = -(-ctx // PAGE)
    g = torch.Generator(device="cuda").manual_seed(3)
    cache = Int2PagedKVCache.allocate(spec, batch * pages_per, batch, device="cuda")
    for name in ("k_codes", "v_codes"):
        getattr(cache, name).view(torch.int32).random_(generator=g)
    for name in ("k_params", "v_params"):
        t = getattr(cache, name)
        t[..., 0].uniform_(0.05, 0.5, generator=g)
        t[..., 1].uniform_(-1.0, 0.0, generator=g)
    cache.k_window.normal_(generator=g)
    cache.v_window.normal_(generator=g)
    indices = torch.randperm(batch * pages_per, device="cuda", generator=g).to(torch.int32)
    indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * pages_per
    last = torch.full((batch,), ctx - (pages_per - 1) * PAGE, dtype=torch.int32, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    qr = [torch.linalg.qr(torch.randn(D, D, device="cuda", generator=g,
                                      dtype=torch.float64))[0].float() for _ in range(2)]
    rot = LayerRotation(torch.stack([qr[0]] * HKV), torch.stack([qr[1]] * HKV), 0.95, 0.95)
    nnz = batch * chunk
    q = torch.randn(nnz, HQ, D, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(nnz, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(nnz, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    qo = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * chunk
    out = torch.empty_like(q)

    def call():
        ops.paged_extend_attention(q, k, v, qo, cache, indptr, indices, last, slots, rot,
                                   out=out, backend="triton", check_bounds=False)
    return call


def _dense_inputs(batch: int, prefix: int, chunk: int):
    import torch
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(batch, HQ, chunk, D, device="cuda", generator=g).to(torch.bfloat16)
    kv = [torch.randn(batch, HKV, prefix + chunk, D, device="cuda", generator=g)
          .to(torch.bfloat16).repeat_interleave(HQ // HKV, dim=1) for _ in range(2)]
    return q, kv[0], kv[1]


def cudnn_call(batch: int, prefix: int, chunk: int):
    import torch
    q, k, v = _dense_inputs(batch, prefix, chunk)
    scale = D ** -0.5
    op = torch.ops.aten._scaled_dot_product_cudnn_attention
    kp, vp = k[:, :, :prefix], v[:, :, :prefix]
    kc, vc = k[:, :, prefix:].contiguous(), v[:, :, prefix:].contiguous()
    kp, vp = kp.contiguous(), vp.contiguous()

    def call():
        if prefix:
            op(q, kp, vp, None, True, 0.0, False, False, scale=scale)
        op(q, kc, vc, None, True, 0.0, True, False, scale=scale)
    call()
    return call, (q, kp, vp, kc, vc)


def flash_call(batch: int, prefix: int, chunk: int):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    q, k, v = _dense_inputs(batch, prefix, chunk)
    mask = causal_lower_right(chunk, prefix + chunk)

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    call()
    return call, (q, k, v)


def flashinfer_call(batch: int, prefix: int, chunk: int):
    import flashinfer
    import torch

    ctx = prefix + chunk
    pages_per = -(-ctx // PAGE)
    g = torch.Generator(device="cuda").manual_seed(4)
    shape = (batch * pages_per, HKV, PAGE, D)
    kp = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
    vp = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
    indices = torch.randperm(batch * pages_per, device="cuda", generator=g).to(torch.int32)
    indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * pages_per
    last = torch.full((batch,), ctx - (pages_per - 1) * PAGE, dtype=torch.int32, device="cuda")
    qo = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * chunk
    q = torch.randn(batch * chunk, HQ, D, device="cuda", generator=g).to(torch.bfloat16)
    out = torch.empty_like(q)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "HND", backend="fa2")
    w.plan(qo, indptr, indices, last, HQ, HKV, D, PAGE, causal=True,
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return (lambda: w.run(q, (kp, vp), out=out)), (kp, vp, ws)


def _time(make, graph: bool, rep: int):
    import torch

    from perf.harness import time_cuda
    try:
        made = make()
        fn = made[0] if isinstance(made, tuple) else made
        t = time_cuda(fn, warmup=3, rep=rep, graph=graph)["median_ms"]
        del made
        torch.cuda.empty_cache()
        return t, None
    except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
        torch.cuda.empty_cache()
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def profile_int2(batch: int, prefix: int, chunk: int, calls: int = 3) -> None:
    """Print the INT2 op's CUDA kernel times per call (torch profiler, eager, warm)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call = int2_call(batch, prefix, chunk)
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    import time
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_time_total > 0]
    ev.sort(key=lambda e: -e.device_time_total)
    total = sum(e.self_device_time_total for e in ev) / calls / 1e3
    print(f"profile batch={batch} prefix={prefix} chunk={chunk}: device {total:.3f} ms per call "
          f"(summed over events), host {host:.3f} ms per call (launch loop, no profiler)",
          flush=True)
    for e in ev[:14]:
        print(f"  {e.self_device_time_total / calls / 1e3:8.3f} ms  x{e.count // calls:<4d} "
              f"{e.key[:110]}", flush=True)
    cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    print("  host (self CPU time per call, under the profiler):", flush=True)
    for e in cpu[:10]:
        print(f"  {e.self_cpu_time_total / calls / 1e3:8.3f} ms  x{e.count // calls:<4d} "
              f"{e.key[:110]}", flush=True)
    del call
    torch.cuda.empty_cache()


INT2_PATHS = {"dense": dict(EXTEND_INT2_DENSE=True, EXTEND_INT2_MIN_PROGRAMS_PER_SM=0),
              "kernel": dict(EXTEND_INT2_DENSE=False, EXTEND_INT2_MIN_PROGRAMS_PER_SM=0),
              "one": dict(EXTEND_INT2_DENSE=False, EXTEND_INT2_MIN_PROGRAMS_PER_SM=10 ** 9)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fi-site", default=None, help="unpacked FlashInfer baseline (setup_site.py)")
    ap.add_argument("--rep", type=int, default=10)
    ap.add_argument("--cases", default=None,
                    help="batch:prefix:chunk,... (default: the standard set)")
    ap.add_argument("--int2-paths", default="",
                    help="also time these INT2-part paths: dense,kernel,one")
    ap.add_argument("--out", default=None, help="folder for the json / md results")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="launch constants of oscar_kernels.triton.paged_extend to try, "
                         "e.g. EXTEND_PART_BLOCK_M=64")
    ap.add_argument("--no-baselines", action="store_true", help="time the INT2 op only")
    ap.add_argument("--profile", default=None, metavar="B:P:C,...",
                    help="also print the INT2 op's kernel times (torch profiler) for these cases")
    a = ap.parse_args(argv)
    if a.fi_site:
        sys.path.insert(0, a.fi_site)
        os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    import torch

    from oscar_kernels.triton import paged_extend as pe
    from perf.harness import env_header, markdown_table, write_results

    for item in a.set:
        name, _, val = item.partition("=")
        if not hasattr(pe, name):
            ap.error(f"--set: oscar_kernels.triton.paged_extend has no {name}")
        setattr(pe, name, type(getattr(pe, name))(val) if not isinstance(getattr(pe, name), str)
                else val)
    cases = CASES if not a.cases else [tuple(int(x) for x in c.split(":"))
                                       for c in a.cases.split(",")]
    paths = [p for p in a.int2_paths.split(",") if p]
    head = env_header()
    print(head, flush=True)
    rows = []
    for batch, prefix, chunk in cases:
        fl = causal_flops(batch, prefix, chunk)
        row = dict(batch=batch, prefix=prefix, chunk=chunk, tflop=fl / 1e12)
        row["int2_ms"], err = _time(lambda: int2_call(batch, prefix, chunk), False, a.rep)
        if err:
            row["int2_error"] = err
        for p in paths:
            saved = {k: getattr(pe, k) for k in INT2_PATHS[p]}
            for k, val in INT2_PATHS[p].items():
                setattr(pe, k, val)
            row[f"int2_{p}_ms"], _ = _time(lambda: int2_call(batch, prefix, chunk), False, a.rep)
            for k, val in saved.items():
                setattr(pe, k, val)
        skip = (None, "not timed")
        row["cudnn_bf16_ms"], e1 = (skip if a.no_baselines else
                                    _time(lambda: cudnn_call(batch, prefix, chunk), True, a.rep))
        row["flash_bf16_ms"], e2 = (skip if a.no_baselines else
                                    _time(lambda: flash_call(batch, prefix, chunk), True, a.rep))
        row["flashinfer_bf16_ms"], e3 = ((None, "no --fi-site") if not a.fi_site or a.no_baselines else
                                         _time(lambda: flashinfer_call(batch, prefix, chunk),
                                               True, a.rep))
        for key, e in (("cudnn_error", e1), ("flash_error", e2), ("flashinfer_error", e3)):
            if e:
                row[key] = e
        bf16 = [t for t in (row["cudnn_bf16_ms"], row["flash_bf16_ms"],
                            row["flashinfer_bf16_ms"]) if t]
        row["best_bf16_ms"] = min(bf16) if bf16 else None
        for key in ("int2", "cudnn_bf16", "best_bf16"):
            t = row.get(f"{key}_ms")
            row[f"{key}_tflops"] = fl / t / 1e9 if t else None
        if row["int2_ms"] and row["cudnn_bf16_ms"]:
            row["int2_over_cudnn"] = row["int2_ms"] / row["cudnn_bf16_ms"]
        if row["int2_ms"] and row["best_bf16_ms"]:
            row["int2_over_best"] = row["int2_ms"] / row["best_bf16_ms"]
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()},
              flush=True)
    cols = [("batch", "batch", ""), ("prefix", "prefix", ""), ("chunk", "chunk", ""),
            ("int2_ms", "INT2 ms", ".3f"), ("cudnn_bf16_ms", "cuDNN BF16 ms", ".3f"),
            ("flash_bf16_ms", "flash BF16 ms", ".3f"),
            ("flashinfer_bf16_ms", "FlashInfer BF16 ms", ".3f"),
            ("int2_tflops", "INT2 TFLOP/s", ".0f"), ("cudnn_bf16_tflops", "cuDNN TFLOP/s", ".0f"),
            ("int2_over_cudnn", "INT2 / cuDNN", ".2f"), ("int2_over_best", "INT2 / best BF16", ".2f")]
    cols += [(f"int2_{p}_ms", f"INT2 {p} ms", ".3f") for p in paths]
    table = markdown_table(rows, cols)
    print(table, flush=True)
    for c in (a.profile.split(",") if a.profile else []):
        profile_int2(*(int(x) for x in c.split(":")))
    if a.out:
        gpu = head.get("gpu", "gpu").lower().replace("nvidia ", "").replace(" ", "-")
        stem = f"{_dt.date.today().isoformat()}_{gpu}_bench_prefill"
        write_results(stem, head, {"rows": rows}, table, out_dir=a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
