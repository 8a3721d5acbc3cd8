"""Timing of the CuTe INT2 decode kernel (and the Triton INT2 kernel) on synthetic caches.

    PYTHONPATH=. python perf/cute_bench.py --model qwen3-8b --batch 1 8 \\
        --context 8192 32768 --out perf/results/cute_decode_smoke

Caches hold random codes, positive random fp16 scales and BF16 windows (timing does not
depend on the values). Each op is timed by perf/harness.py (CUDA-graph replay, cold L2,
median). Bytes are what the kernel must read: INT2 codes+params of every INT2-region
token, BF16 window rows, plus q and o. The CuTe decode gets each case's context as its
length hint (``max_kv_len``); ``--no-length-hint`` plans it from the shapes only.
Other scripts import :data:`MODELS` and :func:`make_cache` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: (query heads, KV heads, head_dim) per GPU: GQA 4, GQA 8, GQA 3 at head_dim 64, and MHA
MODELS = {"qwen3-8b": (32, 8, 128), "llama3-70b-tp8": (8, 1, 128), "smollm2": (9, 3, 64),
          "llama2-7b-tp4": (8, 8, 128)}


def make_cache(spec, batch_size: int, seq_len: int, dev, page_order: str = "random"):
    """A synthetic cache of ``batch_size`` sequences of ``seq_len`` tokens and its page
    table: pages in random order (the default: every page somewhere else), or
    ``"sequential"`` (each sequence's pages consecutive, as an allocator hands out slots to
    a lone request)."""
    from oscar_kernels import Int2PagedKVCache

    pages_per_seq = -(-seq_len // spec.page_size)
    num_pages = batch_size * pages_per_seq
    cache = Int2PagedKVCache.allocate(spec, num_pages, batch_size, device=dev)
    for name in ("k_codes", "v_codes"):
        getattr(cache, name).view(torch.int32).random_()
    for name in ("k_params", "v_params"):
        t = getattr(cache, name)
        t[..., 0].uniform_(0.05, 0.5)
        t[..., 1].uniform_(-1.0, 0.0)
    cache.k_window.normal_()
    cache.v_window.normal_()
    if page_order == "sequential":
        perm = torch.arange(num_pages, device=dev, dtype=torch.int32)
    else:
        perm = torch.randperm(num_pages, device=dev).to(torch.int32)
    kv_indptr = (torch.arange(batch_size + 1, device=dev) * pages_per_seq).to(torch.int32)
    last = (seq_len - 1) % spec.page_size + 1
    kv_last = torch.full((batch_size,), last, dtype=torch.int32, device=dev)
    slots = torch.arange(batch_size, dtype=torch.int32, device=dev)
    return cache, (kv_indptr, perm, kv_last, slots)


def bytes_moved(spec, batch_size: int, seq_len: int, num_qo_heads: int) -> int:
    win = min(seq_len, spec.sink_size) + max(0, min(seq_len, spec.recent_size)
                                             - max(0, spec.sink_size - (seq_len - spec.recent_size)))
    win = min(seq_len, win)
    int2 = seq_len - win
    per_tok_int2 = 2 * spec.num_kv_heads * (spec.packed_dim + 4 * spec.num_groups)
    per_tok_bf16 = 2 * spec.num_kv_heads * spec.head_dim * 2
    qo = 2 * num_qo_heads * spec.head_dim * 2
    return batch_size * (int2 * per_tok_int2 + win * per_tok_bf16 + qo)


def plot_roofline(json_path: str, png_path: str, floor_path: str | None = None) -> None:
    """Achieved TB/s (bytes each kernel must move / median time) vs context, one panel per
    (model, batch), from a ``perf/bench_decode.py`` JSON; dashed line: measured read ceiling;
    with ``floor_path`` (a ``perf/floor.py`` JSON) a dotted line: the fastest contiguous
    read of the same INT2 bytes in the same harness (what a pure stream reaches at that
    size, launch included)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        data = json.load(f)
    ceiling = data["read_bandwidth"]["read_TBps"]
    rows = [r for r in data["rows"] if "context" in r and r.get("cute_ms")]
    floor = {}
    if floor_path:
        with open(floor_path) as f:
            for r in json.load(f)["rows"]:
                floor[(r["preset"], r["batch"], r["context"])] = r["int2_MB"] / r["stream_us"]
    panels = sorted({(r["preset"], r["batch"]) for r in rows})
    presets = sorted({p for p, _ in panels})
    batches = sorted({b for _, b in panels})
    fig, axes = plt.subplots(len(presets), len(batches), figsize=(4 * len(batches),
                             3.2 * len(presets)), sharey=True, squeeze=False)
    series = [("cute_TBps", "CuTe INT2", "C3"), ("triton_TBps", "Triton INT2", "C0"),
              ("fi_TBps", "FlashInfer BF16", "C2"), ("fi8_TBps", "FlashInfer FP8", "C1")]
    for i, preset in enumerate(presets):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r["preset"] == preset and r["batch"] == batch),
                         key=lambda r: r["context"])
            for key, label, color in series:
                pts = [(r["context"], r[key]) for r in sel if r.get(key)]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color,
                            label=label)
            if floor:
                pts = sorted((c, v) for (p, b, c), v in floor.items()
                             if p == preset and b == batch)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ":", color="0.4",
                            label="pure read of the INT2 bytes")
            ax.axhline(ceiling, ls="--", color="k", lw=1, label=f"read ceiling {ceiling:.2f}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{preset}, batch {batch}", fontsize=9)
            ax.set_xlabel("context (tokens)")
            if j == 0:
                ax.set_ylabel("achieved TB/s")
    axes[0][0].legend(fontsize=7)
    gpu = data.get("env", {}).get("gpu", "")
    fig.suptitle(f"Decode attention, bytes each kernel must move / time ({gpu})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--context", type=int, nargs="+", default=[8192, 32768, 65536, 131072])
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--page-order", default="random", choices=["random", "sequential"],
                    help="page table order: random (every page elsewhere) or sequential")
    ap.add_argument("--kv-layout", default="NHD", choices=["NHD", "HND"])
    ap.add_argument("--backends", nargs="+", default=["cute", "triton"])
    ap.add_argument("--max-bytes", type=float, default=40e9)
    ap.add_argument("--rep", type=int, default=30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--breakdown", action="store_true",
                    help="time each launch of the CuTe decode separately (and --splits sweep)")
    ap.add_argument("--splits", type=int, nargs="*", default=[])
    ap.add_argument("--warps", type=int, default=None, choices=[4, 8],
                    help="time the cute backend (and --breakdown / --splits) with CTAs of "
                         "this many warps (default: the plan's choice, oscar_kernels.cute.plan)")
    ap.add_argument("--no-length-hint", action="store_true",
                    help="plan the CuTe decode from the shapes only (max_kv_len=None)")
    ap.add_argument("--plot", nargs=2, metavar=("BENCH_DECODE_JSON", "PNG"),
                    help="only draw the roofline PNG from a perf/bench_decode.py result")
    ap.add_argument("--floor", default=None, metavar="FLOOR_JSON",
                    help="with --plot: also draw perf/floor.py's pure-read rate per shape")
    a = ap.parse_args(argv)
    if a.plot:
        plot_roofline(*a.plot, a.floor)
        return 0
    from harness import env_header, measure_read_bandwidth, tbps, time_cuda

    from oscar_kernels import CacheSpec, LayerRotation, ops

    dev = torch.device("cuda")
    hq, h, d = MODELS[a.model]
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=a.page_size, kv_layout=a.kv_layout)
    rot = LayerRotation.hadamard(d).to(dev)
    ceiling = measure_read_bandwidth(2 << 30)
    rows = []
    for b in a.batch:
        for n in a.context:
            if spec.int2_bytes_per_token * b * n > a.max_bytes:
                continue
            cache, table = make_cache(spec, b, n, dev, a.page_order)
            hint = None if a.no_length_hint else n
            q = torch.randn(b, hq, d, dtype=torch.bfloat16, device=dev)
            nbytes = bytes_moved(spec, b, n, hq)
            row = {"model": a.model, "batch": b, "context": n, "page_size": a.page_size,
                   "page_order": a.page_order, "kv_layout": a.kv_layout, "bytes": nbytes}
            if a.breakdown:
                from oscar_kernels.cute.launch import decode_steps

                rk, rv = rot.per_head(h)
                for ns in [None] + a.splits:
                    out = torch.empty_like(q)
                    steps, _ = decode_steps(q, cache, *table, rk, rv, d ** -0.5, out=out,
                                            num_splits=ns, warps=a.warps,
                                            max_kv_len=hint)
                    for name, fn in steps:
                        fn()
                    key = "auto" if ns is None else f"ns{ns}"
                    for name, fn in steps:
                        row[f"{key}_{name}_ms"] = time_cuda(fn, warmup=3, rep=a.rep)["median_ms"]

                    def all_steps(steps=steps):
                        for _, fn in steps:
                            fn()
                    row[f"{key}_total_ms"] = time_cuda(all_steps, warmup=3, rep=a.rep)["median_ms"]
            for be in a.backends:
                out = torch.empty_like(q)
                try:
                    fn = lambda: ops.paged_decode_attention(q, cache, *table, rot, out=out,  # noqa
                                                            backend=be, check_bounds=False,
                                                            max_kv_len=hint)
                    if be == "cute" and a.warps is not None:
                        from oscar_kernels.cute.launch import decode

                        rk, rv = rot.per_head(h)
                        fn = lambda: decode(q, cache, *table, rk, rv, d ** -0.5,  # noqa
                                            out=out, warps=a.warps, max_kv_len=hint)
                    fn()
                    t = time_cuda(fn, warmup=5, rep=a.rep, graph=True, cold_l2=True)
                    row[f"{be}_ms"] = t["median_ms"]
                    row[f"{be}_TBps"] = tbps(nbytes, t["median_ms"])
                    row[f"{be}_frac"] = tbps(nbytes, t["median_ms"]) / ceiling["read_TBps"]
                except Exception as exc:  # noqa: BLE001  (a row records the failure)
                    row[f"{be}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del cache, table
            torch.cuda.empty_cache()
    result = {"header": env_header(" ".join(sys.argv)), "ceiling": ceiling, "rows": rows}
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out + ".json", "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
