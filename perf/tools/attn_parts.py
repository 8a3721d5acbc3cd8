"""Per-layer parts of perf/bench_e2e.py's INT2 attention on one GPU: the quantize-append of
one new token per sequence, the decode attention, and both in one CUDA graph.

    PYTHONPATH=. python3 perf/tools/attn_parts.py --batch 50 8 1 --context 100000
    PYTHONPATH=. python3 perf/tools/attn_parts.py --stack --batch 50 --context 100000

``--stack``: perf/bench_e2e.py's own attention stack instead (its ``Int2PagedAttention``,
one cache and rotation per layer for all 36 layers, its ``PageTable`` and fill), timed as
the whole stack (``attention_only``, what bench_e2e reports as "attn"), the 36 decodes
alone, the 36 appends alone and layer 0's decode 36 times; per-layer averages. Tells a
per-layer cost that only the stack has from one the kernel has everywhere. ``--sustain
SECONDS`` then replays one decode back to back for that long (no L2 flush), timing every
replay with CUDA events while ``nvidia-smi`` samples the SM clock, power and clock-event
reasons every 100 ms: whether a decode slows down under sustained load. ``--bf16`` does
the same for bench_e2e.py's BF16 stack (FlashInfer decode on NHD pages, page 16; needs
FlashInfer importable).

Qwen3-8B shape (32 query / 8 KV heads, head_dim 128, page 16, HND pages), a random
orthogonal rotation shared by the heads (as bench_e2e.py), ``ops`` with
``check_bounds=False``; times are medians of CUDA-graph replays with a cold L2
(perf/harness.py), printed in microseconds.
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oscar_kernels import ops  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[50, 8, 1])
    ap.add_argument("--context", type=int, default=100000)
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--stack", action="store_true",
                    help="bench_e2e.py's 36-layer qwen3-8b INT2 attention stack (HND)")
    ap.add_argument("--sustain", type=float, default=0.0,
                    help="with --stack: seconds of back-to-back decode replays to time")
    ap.add_argument("--bf16", action="store_true",
                    help="with --stack: bench_e2e.py's BF16 stack (FlashInfer) instead")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    import torch
    if a.stack:
        return stack(a)

    from oscar_kernels import CacheSpec, LayerRotation
    from cute_bench import make_cache
    from perf.harness import env_header, time_cuda

    dev = torch.device("cuda")
    print(env_header(), flush=True)
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=16, kv_layout="HND")
    gen = torch.Generator().manual_seed(0)
    rk = torch.linalg.qr(torch.randn(128, 128, generator=gen, dtype=torch.float64))[0].float()
    rot = LayerRotation(rk[None].to(dev), rk.T.contiguous()[None].to(dev))
    n = a.context
    for b in a.batch:
        cache, (indptr, indices, last, slots) = make_cache(spec, b, n, dev)
        q = torch.randn(b, 32, 128, dtype=torch.bfloat16, device=dev)
        k = torch.randn(b, 8, 128, dtype=torch.bfloat16, device=dev)
        v = torch.randn(b, 8, 128, dtype=torch.bfloat16, device=dev)
        bidx = torch.arange(b, dtype=torch.int32, device=dev)
        pos = torch.full((b,), n - 1, dtype=torch.int32, device=dev)
        out = torch.empty_like(q)

        def append():
            ops.quantize_append_paged_kv_cache(k, v, bidx, pos, cache, indices, indptr, last,
                                               slots, rot, check_bounds=False)

        def decode():
            ops.paged_decode_attention(q, cache, indptr, indices, last, slots, rot, out=out,
                                       check_bounds=False)

        def both():
            append()
            decode()
        t = {name: 1e3 * time_cuda(fn, warmup=3, rep=a.rep)["median_ms"]
             for name, fn in (("append", append), ("decode", decode), ("both", both))}
        print(f"batch {b} context {n}: append {t['append']:.1f} us, decode {t['decode']:.1f} "
              f"us, both {t['both']:.1f} us", flush=True)
        del cache
    return 0


def stack(a, dev=None) -> int:
    """bench_e2e.py's own qwen3-8b attention stack (INT2 on HND pages, or with ``--bf16``
    the BF16 FlashInfer one) at each batch size: whole-stack and per-part timings, then the
    sustained-load replay of layer 0's decode when ``--sustain`` is given. ``dev``: the
    GPU (tests pass a CPU device with the timers stubbed)."""
    import torch

    from perf import bench_e2e as e2e
    from perf.harness import env_header, time_cuda

    dev = dev or torch.device("cuda")
    print(env_header(), flush=True)
    cfg = e2e.PRESETS["qwen3-8b"]
    spec = e2e.int2_spec(cfg, 16, None, "HND")
    n, layers = a.context, cfg.num_layers
    kind = "bf16 " if a.bf16 else ""
    for b in a.batch:
        pages = b * -(-n // spec.page_size)
        if a.bf16:
            attn = e2e.Bf16PagedAttention(cfg, page_size=spec.page_size, num_pages=pages,
                                          device=dev, kernel="flashinfer")
        else:
            attn = e2e.Int2PagedAttention(cfg, spec, num_pages=pages, num_window_slots=b,
                                          device=dev, backend="auto", seed=0)
        attn.fill_random(1)
        table = e2e.PageTable(b, n, spec.page_size, pages, dev, seed=0)
        table.set_lengths([n] * b)
        attn.prepare(table)
        gen = torch.Generator(device=dev).manual_seed(7)
        q = torch.randn(b, cfg.num_qo_heads, cfg.head_dim, generator=gen, device=dev)
        q = q.to(torch.bfloat16)
        k = torch.randn(b, cfg.num_kv_heads, cfg.head_dim, generator=gen, device=dev)
        k = k.to(torch.bfloat16)
        v = torch.randn_like(k)
        out = torch.empty_like(q)
        if hasattr(attn, "check_bounds"):
            attn.check_bounds = True
        attn.forward(0, q, k, v, out)          # eager (bounds checked, operands cached)
        if hasattr(attn, "check_bounds"):
            attn.check_bounds = False
        m = table.num_used_pages

        def decode(i):
            if a.bf16:
                attn.wrapper.run(q, (attn.k_pools[i], attn.v_pools[i]), out=out)
                return
            ops.paged_decode_attention(q, attn.caches[i], table.kv_indptr,
                                       table.kv_indices[:m], table.kv_last_page_len,
                                       table.window_slots, attn.rotations[i], out=out,
                                       check_bounds=False)

        def append(i):
            ops.quantize_append_paged_kv_cache(
                k, v, table.batch_indices, table.positions, attn.caches[i],
                table.kv_indices[:m], table.kv_indptr, table.kv_last_page_len,
                table.window_slots, attn.rotations[i], check_bounds=False)

        cases = {"stack (append+decode, as bench_e2e attn)":
                 lambda: [attn.forward(i, q, k, v, out) for i in range(layers)]}
        if not a.bf16:
            cases["decodes only"] = lambda: [decode(i) for i in range(layers)]
            cases["appends only"] = lambda: [append(i) for i in range(layers)]
        cases["layer 0 decode x36"] = lambda: [decode(0) for _ in range(layers)]
        for name, fn in cases.items():
            t = time_cuda(fn, warmup=2, rep=a.rep)
            print(f"{kind}batch {b} context {n} {name}: {t['median_ms']:.3f} ms, "
                  f"{1e3 * t['median_ms'] / layers:.1f} us per layer ({t['mode']})", flush=True)
        if a.sustain > 0:
            sustain(lambda: decode(0), a.sustain, f"{kind}batch {b} context {n} decode")
        del attn, table
        torch.cuda.empty_cache()
    return 0


def sustain(fn, seconds: float, label: str) -> None:
    """Replay ``fn`` (captured once) back to back for ``seconds``; print the replay times
    per 0.25 s window and what nvidia-smi sampled meanwhile."""
    import statistics
    import subprocess
    import time

    import torch

    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    time.sleep(1.0)                      # let the clocks settle after the setup
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
         "clocks_event_reasons.active", "--format=csv,noheader", "-lms", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.3)
    evs, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(8)]
        for e0, e1 in batch:
            e0.record()
            g.replay()
            e1.record()
        batch[-1][1].synchronize()
        evs.extend((time.perf_counter() - t0, e0.elapsed_time(e1)) for e0, e1 in batch)
    time.sleep(0.3)
    smi.terminate()
    lines = smi.communicate()[0].strip().splitlines()
    print(f"{label}: {len(evs)} back-to-back replays in {seconds:.1f} s; median ms per "
          "0.25 s window:", flush=True)
    w = 0.25
    for k in range(int(seconds / w) + 1):
        xs = [ms for t, ms in evs if k * w <= t < (k + 1) * w]
        if xs:
            print(f"  {k * w:5.2f}-{(k + 1) * w:5.2f} s: {statistics.median(xs):.4f} ms "
                  f"(n={len(xs)})", flush=True)
    print("  nvidia-smi (timestamp, SM MHz, mem MHz, W, C, clock-event reasons):", flush=True)
    for ln in lines:
        print("   ", ln, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
