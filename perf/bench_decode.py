"""Decode attention: INT2 (Triton, and CuTe when it can run) vs BF16 (FlashInfer, SDPA).

One run on one GPU, side by side on the same shapes: median time (CUDA-graph replay,
cold L2, :mod:`perf.harness`), bytes moved, achieved TB/s against the read ceiling
measured in the same run, and the speedup of each INT2 kernel over each BF16 baseline.

    PYTHONPATH=. python perf/bench_decode.py --presets qwen3-8b --batches 1,8,32 \\
        --contexts 8192,32768,65536,131072 --fi-site FLASHINFER_SITE_DIR

Cache contents: the INT2 pages are filled directly with random code bytes and
realistic fp16 params (scale in [0.02, 0.1], zero = -1.5 · scale), the BF16 windows and
the FlashInfer/SDPA caches with N(0, 1) bf16; page ids are a random permutation. Timing
does not depend on the values (no data-dependent control flow in any kernel).

Bytes moved (each read once, what the kernel must move):

* INT2: K+V codes and params of the INT2 positions ``[S, L - W)``, K+V BF16 window rows
  ``min(L, S + W)``, the page ids, q, o;
* BF16: K+V of ``L`` tokens, the page ids (FlashInfer), q, o.

The CuTe decode gets the context as its length hint (``max_kv_len``, the longest sequence,
which FlashInfer's ``plan`` also reads from the page table on the host); with
``--no-length-hint`` it is planned from the shapes alone.

Results: ``perf/results/<date>_<gpu>_bench_decode.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import env_header, markdown_table, measure_read_bandwidth, profile_kernels, tbps, time_cuda, write_results  # noqa: E402

PRESETS = {
    "qwen3-8b": dict(num_qo_heads=32, num_kv_heads=8, head_dim=128),
    "llama3-70b-tp8": dict(num_qo_heads=8, num_kv_heads=1, head_dim=128),
    "smollm2-135m": dict(num_qo_heads=9, num_kv_heads=3, head_dim=64),
}


def parse_triton_configs(text: str):
    """``"128x4x2,128x4x2:r168:t792:slow"`` → DecodeConfig list.

    ``BNxWARPSxSTAGES`` then optional ``:rN`` (maxnreg), ``:tN`` (target programs),
    ``:sN`` (fixed split count), ``:slow`` (element-wise unpack instead of the PTX one),
    ``:norot`` / ``:rot`` (queries rotated by a torch GEMM before the launch / in the
    kernel; default: by batch, see ``DecodeConfig``), ``:magic`` (the 1024-offset PTX
    unpack instead of the subnormal one), ``:mergerot`` (R_V^T in the merge, not in the
    split epilogue), ``:meN`` / ``:mwN`` (merge tile elements / warps).
    ``default`` alone is ``DecodeConfig()``.
    """
    from oscar_kernels.triton.paged_decode import DecodeConfig

    out = []
    for item in filter(None, text.split(",")):
        if item == "default":
            out.append((item, DecodeConfig()))
            continue
        body, *opts = item.replace("@", ":t").split(":")
        bn, nw, ns = (int(x) for x in body.split("x"))
        kw = dict(block_n=bn, num_warps=nw, num_stages=ns)
        for o in opts:
            if o == "slow":
                kw["fast_unpack"] = False
            elif o == "norot":
                kw["rotate_in_kernel"] = False
            elif o == "rot":
                kw["rotate_in_kernel"] = True
            elif o == "magic":
                kw["unpack"] = "magic"
            elif o == "mergerot":
                kw["unrotate_in_split"] = False
            elif o[:2] == "me":
                kw["merge_elems"] = int(o[2:])
            elif o[:2] == "mw":
                kw["merge_warps"] = int(o[2:])
            elif o[0] == "r":
                kw["maxnreg"] = int(o[1:])
            elif o[0] == "t":
                kw["target_programs"] = int(o[1:])
            elif o[0] == "s":
                kw["num_splits"] = int(o[1:])
            else:
                raise ValueError(f"--triton-configs: unknown option {o!r} in {item!r}")
        out.append((item, DecodeConfig(**kw)))
    return out


def kernel_breakdown(fn, iters: int = 20) -> dict:
    """Average GPU microseconds per call of each kernel ``fn`` launches (torch profiler)."""
    return {k: round(us, 2) for k, (_, us) in profile_kernels(fn, iters).items()}


def make_int2_case(preset, batch, ctx, page_size, gen_seed=0, kv_layout="NHD"):
    from oscar_kernels import CacheSpec, Int2PagedKVCache

    h, d, hq = preset["num_kv_heads"], preset["head_dim"], preset["num_qo_heads"]
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=page_size, kv_layout=kv_layout)
    pages_per = math.ceil(ctx / page_size)
    num_pages = batch * pages_per
    cache = Int2PagedKVCache.allocate(spec, num_pages, batch, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(gen_seed)
    for codes in (cache.k_codes, cache.v_codes):
        codes.view(-1).copy_(torch.randint(0, 256, (codes.numel(),), device="cuda",
                                           dtype=torch.int32, generator=g).to(torch.uint8))
    for params in (cache.k_params, cache.v_params):
        scale = torch.rand(params.shape[:-1], device="cuda", generator=g) * 0.08 + 0.02
        params[..., 0] = scale.to(params.dtype)
        params[..., 1] = (-1.5 * scale).to(params.dtype)
    for w in (cache.k_window, cache.v_window):
        w.copy_(torch.randn(w.shape, device="cuda", generator=g).to(torch.bfloat16))
    indices = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32)
    indptr = (torch.arange(batch + 1, device="cuda", dtype=torch.int32) * pages_per)
    last = torch.full((batch,), ctx - (pages_per - 1) * page_size, dtype=torch.int32, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, d, device="cuda", generator=g).to(torch.bfloat16)
    eye = torch.linalg.qr(torch.randn(d, d, device="cuda", generator=g, dtype=torch.float64))[0]
    rot = eye.to(torch.float32)[None].expand(h, d, d)
    return dict(spec=spec, cache=cache, kv_indptr=indptr, kv_indices=indices,
                kv_last_page_len=last, window_slots=slots, q=q, rot_k=rot, rot_v=rot)


def int2_bytes(spec, batch, ctx, hq):
    s, w = spec.sink_size, spec.recent_size
    n_int2 = max(0, ctx - w - s)
    n_win = min(ctx, s + w)
    h, d = spec.num_kv_heads, spec.head_dim
    per_tok_int2 = 2 * h * (spec.packed_dim + spec.num_groups * 2 * 2)
    per_tok_bf16 = 2 * h * d * 2
    pages = math.ceil(ctx / spec.page_size)
    return batch * (n_int2 * per_tok_int2 + n_win * per_tok_bf16 + 4 * pages + 2 * 2 * hq * d)


def bf16_bytes(batch, ctx, h, hq, d, page_size):
    return batch * (ctx * 2 * h * d * 2 + 4 * math.ceil(ctx / page_size) + 2 * 2 * hq * d)


def run_flashinfer(preset, batch, ctx, page_size, args, kv_dtype=torch.bfloat16):
    """FlashInfer decode over a paged KV cache of ``kv_dtype`` (bf16, or e4m3 without
    scales), tensor-core path."""
    import flashinfer

    h, d, hq = preset["num_kv_heads"], preset["head_dim"], preset["num_qo_heads"]
    pages_per = math.ceil(ctx / page_size)
    num_pages = batch * pages_per
    g = torch.Generator(device="cuda").manual_seed(1)
    shape = ((num_pages, page_size, h, d) if args.kv_layout == "NHD"
             else (num_pages, h, page_size, d))
    kp = torch.randn(shape, device="cuda", generator=g).to(kv_dtype)
    vp = torch.randn(shape, device="cuda", generator=g).to(kv_dtype)
    indptr = (torch.arange(batch + 1, device="cuda", dtype=torch.int32) * pages_per)
    indices = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32)
    last = torch.full((batch,), ctx - (pages_per - 1) * page_size, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, d, device="cuda", generator=g).to(torch.bfloat16)
    out = torch.empty_like(q)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, args.kv_layout,
                                                            use_tensor_cores=True)
    wrapper.plan(indptr, indices, last, hq, h, d, page_size, q_data_type=torch.bfloat16,
                 kv_data_type=kv_dtype)
    res = time_cuda(lambda: wrapper.run(q, (kp, vp), out=out), warmup=args.warmup, rep=args.rep)
    del kp, vp, ws
    return res


def run_sdpa(preset, batch, ctx, args):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, d, hq = preset["num_kv_heads"], preset["head_dim"], preset["num_qo_heads"]
    g = torch.Generator(device="cuda").manual_seed(2)
    k = torch.randn(batch, h, ctx, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(batch, h, ctx, d, device="cuda", generator=g).to(torch.bfloat16)
    q = torch.randn(batch, hq, 1, d, device="cuda", generator=g).to(torch.bfloat16)

    def fn():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                          SDPBackend.EFFICIENT_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    res = time_cuda(fn, warmup=args.warmup, rep=args.rep)
    del k, v
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="qwen3-8b")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--contexts", default="8192,32768,65536,131072")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-layout", default="NHD", choices=["NHD", "HND"],
                   help="page layout of the INT2 caches and of FlashInfer's BF16/FP8 caches")
    p.add_argument("--baselines", default="flashinfer,sdpa")
    p.add_argument("--triton-configs", default="default",
                   help="block_n x num_warps x num_stages[@target_programs], comma separated; "
                        "every config is timed, the fastest is reported as 'triton'")
    p.add_argument("--triton-report", default="best",
                   help="'best' (fastest of --triton-configs) or one config name: the time "
                        "reported as 'triton' (the others stay in triton_sweep)")
    p.add_argument("--fi-site", default=None, help="site dir made by setup_site.py")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rep", type=int, default=30)
    p.add_argument("--budget", type=float, default=420.0, help="seconds; later shapes skipped")
    p.add_argument("--profile", action="store_true",
                   help="per-kernel GPU time of the best Triton config (torch profiler, eager)")
    p.add_argument("--no-length-hint", action="store_true",
                   help="plan the CuTe decode from the shapes only (default: the context as "
                        "its max_kv_len hint, as FlashInfer's plan sees the lengths)")
    p.add_argument("--stem", default=None)
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)
    t0 = time.time()
    if args.fi_site:
        sys.path.insert(0, args.fi_site)
        os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    from oscar_kernels.triton.paged_decode import paged_decode_attention_triton

    cute_mod = None
    try:
        from oscar_kernels import cute as cute_mod  # noqa: PLC0415
        from oscar_kernels.cute import config as cute_config  # noqa: PLC0415
        from oscar_kernels.cute import plan as cute_plan  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        cute_mod = None
    header = env_header()
    bw = measure_read_bandwidth()
    print(f"[env] {header}\n[bw] read {bw['read_TBps']:.2f} TB/s, copy {bw['copy_TBps']:.2f} TB/s",
          flush=True)
    configs = parse_triton_configs(args.triton_configs)
    baselines = [b for b in args.baselines.split(",") if b]
    rows, errors = [], []
    for preset_name in args.presets.split(","):
        preset = PRESETS[preset_name]
        for batch in (int(x) for x in args.batches.split(",")):
            for ctx in (int(x) for x in args.contexts.split(",")):
                row = dict(preset=preset_name, batch=batch, context=ctx,
                           page_size=args.page_size)
                if time.time() - t0 > args.budget:
                    row["skipped"] = "time budget"
                    rows.append(row)
                    continue
                try:
                    case = make_int2_case(preset, batch, ctx, args.page_size,
                                          kv_layout=args.kv_layout)
                    spec = case["spec"]
                    row["int2_bytes"] = int2_bytes(spec, batch, ctx, preset["num_qo_heads"])
                    row["bf16_bytes"] = bf16_bytes(batch, ctx, spec.num_kv_heads,
                                                   preset["num_qo_heads"], spec.head_dim,
                                                   args.page_size)
                    out = torch.empty_like(case["q"])
                    sm = 1.0 / math.sqrt(spec.head_dim)
                    tab = (case["kv_indptr"], case["kv_indices"], case["kv_last_page_len"],
                           case["window_slots"], case["rot_k"], case["rot_v"], sm)
                    per_cfg = {}
                    for name, cfg in configs:
                        def fn(cfg=cfg):
                            return paged_decode_attention_triton(case["q"], case["cache"], *tab,
                                                                 out=out, config=cfg)
                        try:   # a failing Triton config must not cost the row its other columns
                            per_cfg[name] = time_cuda(fn, warmup=args.warmup,
                                                      rep=args.rep)["median_ms"]
                        except Exception as exc:  # noqa: BLE001
                            row.setdefault("triton_errors", {})[name] = \
                                f"{type(exc).__name__}: {str(exc)[:200]}"
                            errors.append(f"triton {name}: {row['triton_errors'][name]}")
                    if not per_cfg:
                        per_cfg = {"none": float("nan")}
                    best = min(per_cfg, key=per_cfg.get)
                    row.update(triton_best_ms=per_cfg[best], triton_best_config=best)
                    if args.triton_report != "best":
                        best = args.triton_report
                    row.update(triton_ms=per_cfg.get(best, float("nan")), triton_config=best,
                               triton_sweep=per_cfg)
                    if args.profile:
                        cfg_best = dict(configs)[best]
                        try:
                            row["triton_kernels_us"] = kernel_breakdown(
                                lambda: paged_decode_attention_triton(case["q"], case["cache"], *tab,
                                                                      out=out, config=cfg_best))
                            print(f"[profile] B={batch} L={ctx} {best}: {row['triton_kernels_us']}",
                                  flush=True)
                        except Exception as exc:  # noqa: BLE001 - profiler unavailable
                            row["triton_kernels_us"] = f"{type(exc).__name__}: {str(exc)[:120]}"
                    row["triton_TBps"] = tbps(row["int2_bytes"], row["triton_ms"])
                    if cute_mod is not None:
                        try:
                            cute_mod.can_implement("decode", device=torch.device("cuda"), spec=spec,
                                                   num_qo_heads=preset["num_qo_heads"],
                                                   dtype=torch.bfloat16)
                            hint = None if args.no_length_hint else ctx
                            r = time_cuda(lambda: cute_mod.decode(case["q"], case["cache"], *tab,
                                                                  out=out, max_kv_len=hint),
                                          warmup=args.warmup, rep=args.rep)
                            row["cute_ms"] = r["median_ms"]
                            row["cute_TBps"] = tbps(row["int2_bytes"], r["median_ms"])
                            warps, splits = cute_plan.plan(
                                batch, spec.num_kv_heads,
                                torch.cuda.get_device_properties(0).multi_processor_count,
                                preset["num_qo_heads"] // spec.num_kv_heads, spec.head_dim,
                                cute_plan.wide_available(
                                    preset["num_qo_heads"] // spec.num_kv_heads, spec.head_dim),
                                hint)
                            # the build it launches: decode / decode_pair, or the merge-CTA
                            # or 4-deep ring build of decode_pair (cute.plan.launch_op)
                            op = cute_plan.launch_op(
                                batch, spec.num_kv_heads,
                                preset["num_qo_heads"] // spec.num_kv_heads, spec.head_dim,
                                warps, splits, torch.device("cuda"),
                                any_page=spec.page_size % cute_config.CHUNK != 0,
                                max_kv_len=hint)
                            row["cute_plan"] = f"{warps} warps x {splits} splits, {op}"
                        except Exception as exc:  # noqa: BLE001 - unavailable or unsupported
                            row["cute_note"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    del case, out
                    torch.cuda.empty_cache()
                    if "flashinfer" in baselines:
                        try:
                            r = run_flashinfer(preset, batch, ctx, args.page_size, args)
                            row["fi_ms"] = r["median_ms"]
                            row["fi_TBps"] = tbps(row["bf16_bytes"], r["median_ms"])
                        except Exception as exc:  # noqa: BLE001
                            row["fi_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                            errors.append(row["fi_error"])
                        torch.cuda.empty_cache()
                    if "flashinfer_fp8" in baselines:
                        try:
                            r = run_flashinfer(preset, batch, ctx, args.page_size, args,
                                               kv_dtype=torch.float8_e4m3fn)
                            row["fi8_ms"] = r["median_ms"]
                            row["fi8_TBps"] = tbps((row["bf16_bytes"] + 4 * batch * math.ceil(ctx / args.page_size)) / 2, r["median_ms"])
                        except Exception as exc:  # noqa: BLE001
                            row["fi8_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                            errors.append(row["fi8_error"])
                        torch.cuda.empty_cache()
                    if "sdpa" in baselines:
                        try:
                            r = run_sdpa(preset, batch, ctx, args)
                            row["sdpa_ms"] = r["median_ms"]
                            row["sdpa_TBps"] = tbps(row["bf16_bytes"] - 4 * batch * math.ceil(ctx / args.page_size), r["median_ms"])
                        except Exception as exc:  # noqa: BLE001
                            row["sdpa_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                            errors.append(row["sdpa_error"])
                        torch.cuda.empty_cache()
                    for k in ("triton", "cute"):
                        if row.get(f"{k}_ms"):
                            row[f"{k}_pct_ceiling"] = 100 * row[f"{k}_TBps"] / bw["read_TBps"]
                            for base in ("fi", "sdpa", "fi8"):
                                if row.get(f"{base}_ms"):
                                    row[f"{k}_vs_{base}"] = row[f"{base}_ms"] / row[f"{k}_ms"]
                except Exception as exc:  # noqa: BLE001 - keep what was measured
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    errors.append(row["error"] + " | " + traceback.format_exc().splitlines()[-3])
                    torch.cuda.empty_cache()
                rows.append(row)
                print(f"[row] {preset_name} B={batch} L={ctx}: "
                      f"triton {row.get('triton_ms', float('nan')):.4f} ms "
                      f"({row.get('triton_config')}; {row.get('triton_TBps') or 0:.2f} TB/s) "
                      f"fi {row.get('fi_ms', float('nan')):.4f} sdpa {row.get('sdpa_ms', float('nan')):.4f} "
                      f"speedup vs fi {row.get('triton_vs_fi', float('nan')):.2f}x "
                      f"{row.get('error', '')}", flush=True)
    cols = [("preset", "preset", ""), ("batch", "B", ""), ("context", "ctx", ""),
            ("int2_bytes", "INT2 MB", ""), ("triton_ms", "Triton ms", ".4f"),
            ("triton_TBps", "Triton TB/s", ".2f"), ("triton_pct_ceiling", "% read ceiling", ".0f"),
            ("cute_ms", "CuTe ms", ".4f"), ("bf16_bytes", "BF16 MB", ""),
            ("fi_ms", "FlashInfer BF16 ms", ".4f"), ("fi_TBps", "FI TB/s", ".2f"),
            ("sdpa_ms", "SDPA BF16 ms", ".4f"), ("triton_vs_fi", "Triton vs FI", ".2f"),
            ("triton_vs_sdpa", "Triton vs SDPA", ".2f"), ("cute_vs_fi", "CuTe vs FI", ".2f"),
            ("triton_config", "Triton config", ""),
            ("cute_TBps", "CuTe TB/s", ".2f"), ("cute_pct_ceiling", "CuTe % ceiling", ".0f"),
            ("fi8_ms", "FlashInfer FP8 ms", ".4f"), ("cute_vs_fi8", "CuTe vs FI FP8", ".2f"),
            ("cute_plan", "CuTe plan", "")]
    table_rows = [dict(r, int2_bytes=round(r["int2_bytes"] / 1e6, 1) if "int2_bytes" in r else None,
                       bf16_bytes=round(r["bf16_bytes"] / 1e6, 1) if "bf16_bytes" in r else None)
                  for r in rows]
    md = (f"Read ceiling (torch.sum over 4 GiB, cold L2): **{bw['read_TBps']:.2f} TB/s**; "
          f"copy {bw['copy_TBps']:.2f} TB/s. Times: median of CUDA-graph replays, cold L2. "
          f"Speedup = BF16 time / INT2 time. Sweep per row in the JSON.\n\n"
          + markdown_table(table_rows, cols)
          + ("\n\nErrors:\n" + "\n".join(f"- {e}" for e in errors) if errors else ""))
    gpu = header.get("gpu", "gpu").replace(" ", "_").lower()
    stem = args.stem or f"{_dt.date.today().isoformat()}_{gpu}_bench_decode"
    paths = write_results(stem, header, {"read_bandwidth": bw, "rows": rows, "errors": errors,
                                         "args": vars(args)}, md, args.out_dir)
    print(md)
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
