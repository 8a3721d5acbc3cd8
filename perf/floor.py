"""What any kernel pays in perf/harness.py's timing, and how fast a pure read of N bytes is.

The decode targets of issue #4 are times: 80 % of the read ceiling at a shape is
``bytes / (0.8 * ceiling)``, 5x FlashInfer is ``FlashInfer time / 5``. Whether a target is
within reach of *any* kernel depends on what the harness itself charges (event, graph
launch, the first bytes' latency) and on how fast a read of that many bytes can be at
all. This script measures, on the GPU it runs on, with the same harness as
perf/bench_decode.py (CUDA-graph replay, cold L2, median):

* ``empty``: a Triton kernel that does nothing, 1 CTA and 264 CTAs -- the floor of any call;
* ``stream``: the fastest of a sweep of Triton streaming-sum kernels (grid, block, stages)
  over a contiguous buffer of exactly a shape's INT2 byte count (perf/bench_decode.py's
  ``int2_bytes``) -- a lower bound on the time of a kernel that must read those bytes
  (the INT2 cache is paged and has a page table to follow first, so a real kernel is
  slower);
* ``chase``: one thread following a chain of dependent 4-byte loads (``ld.global.cg``,
  past L1) through a buffer larger than L2 (HBM round trip) and through a small one it
  laps several times (L2 round trip) -- the cost of each dependent step a decode needs
  before its first KV byte (page table) and after its last (split merge).

With ``--table <bench_decode json>`` it prints, per shape of that table, the times the
targets require next to the stream floor and the CuTe time of that run.

    PYTHONPATH=. python perf/floor.py --table perf/results/<...>_bench_decode_hnd_<c>.json \\
        --out-dir perf/results --stem <date>_h200_floor_<c>
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the GPU machine and CI both have triton
    triton = None

GRID_WAVES = (1, 2, 4, 8, 16)     # programs = waves x SMs
BLOCKS = (1024, 4096)             # int32 elements per load step
STAGES = (1, 3)


def targets(row: dict, ceiling_tbps: float) -> dict:
    """Times (us) issue #4's targets require at a bench_decode row: 80 % of the read
    ceiling on the row's INT2 bytes, and 5x (contexts >= 64K, batch >= 8) or 3x (batch 1)
    the row's FlashInfer BF16 time, when the row has one."""
    out = {"t80_us": row["int2_bytes"] / (0.8 * ceiling_tbps * 1e12) * 1e6}
    fi = row.get("fi_ms")
    if fi:
        if row["batch"] == 1:
            out["tfi_us"], out["fi_factor"] = fi * 1e3 / 3, 3
        elif row["context"] >= 65536:
            out["tfi_us"], out["fi_factor"] = fi * 1e3 / 5, 5
    return out


def stream_configs(nbytes: int, sms: int) -> list[tuple[int, int, int]]:
    """(programs, block, stages) sweep for a read of ``nbytes``: every program reads at
    least one block; configs that would need more programs than blocks are left out."""
    n = nbytes // 4
    out = []
    for block in BLOCKS:
        for waves in GRID_WAVES:
            progs = waves * sms
            if progs * block > max(n, block):
                continue
            for st in STAGES:
                out.append((progs, block, st))
    if not out:
        out.append((1, BLOCKS[0], 1))
    return out


def kernels():
    """The three Triton kernels: an empty one, a streaming sum, a pointer chase."""
    if triton is None:
        raise RuntimeError("perf/floor.py needs triton")
    return _noop, _stream, _chase


if triton is not None:
    @triton.jit
    def _noop(x_ptr):
        pass

    @triton.jit
    def _stream(x_ptr, out_ptr, n_per_prog, BLOCK: tl.constexpr, STAGES: tl.constexpr):
        pid = tl.program_id(0)
        base = x_ptr + pid.to(tl.int64) * n_per_prog
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in tl.range(0, n_per_prog, BLOCK, num_stages=STAGES):
            acc += tl.load(base + i + tl.arange(0, BLOCK))
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit
    def _chase(p_ptr, out_ptr, start, steps):
        idx = start
        for _ in range(steps):
            idx = tl.load(p_ptr + idx, cache_modifier=".cg")   # L2, not L1
        tl.store(out_ptr, idx)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default=None, help="a perf/bench_decode.py JSON: its shapes")
    ap.add_argument("--sizes-mb", default="", help="extra read sizes (MB, comma separated)")
    ap.add_argument("--rep", type=int, default=15)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--stem", default=None)
    a = ap.parse_args(argv)

    import torch  # noqa: PLC0415 - CPU-only machines can still --help
    from harness import env_header, measure_read_bandwidth, time_cuda, write_results  # noqa: PLC0415

    _noop, _stream, _chase = kernels()

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    header = env_header()
    bw = measure_read_bandwidth()
    ceiling = bw["read_TBps"]
    print(f"[env] {header['gpu']}, commit {header['git_commit']}; read ceiling "
          f"{ceiling:.2f} TB/s", flush=True)
    res: dict = {"read_bandwidth": bw}

    # ---- empty kernels
    x = torch.zeros(1, dtype=torch.int32, device=dev)
    res["empty_us"] = {}
    for grid in (1, 2 * sms):
        r = time_cuda(lambda grid=grid: _noop[(grid,)](x, num_warps=8), rep=a.rep * 2)
        res["empty_us"][str(grid)] = r["median_ms"] * 1e3
    print(f"[empty] {res['empty_us']}", flush=True)

    # ---- dependent loads: a 256 MB chain (every hop a different 4 KB line: HBM) and a
    # 1 MB chain of 256 hops walked several times (after its first lap every hop hits L2).
    # Both cold-L2 timed: the flush before each repetition keeps the GPU busy while the
    # host launches, so host latency stays out of the differences.
    res["chase"] = {}
    g = torch.Generator(device="cpu").manual_seed(0)
    for name, nbytes, steps_list in (("hbm", 256 << 20, (1, 17, 65)),
                                     ("l2", 1 << 20, (513, 1025, 2049))):
        n = nbytes // 4
        stride = 1024                            # 4 KB apart: one sector per hop
        nodes = torch.randperm(n // stride, generator=g) * stride
        chain = torch.zeros(n, dtype=torch.int32)
        chain[nodes] = torch.roll(nodes, -1).to(torch.int32)   # one cycle through all nodes
        start = int(nodes[0])
        chain = chain.to(dev)
        out = torch.zeros(1, dtype=torch.int32, device=dev)
        t = {}
        for steps in steps_list:
            r = time_cuda(lambda steps=steps: _chase[(1,)](chain, out, start, steps,
                                                             num_warps=1), rep=a.rep)
            t[steps] = r["median_ms"] * 1e3
        lo, hi = steps_list[1], steps_list[2]
        res["chase"][name] = {"us": t, "per_load_us": (t[hi] - t[lo]) / (hi - lo)}
        print(f"[chase {name}] {t} -> {res['chase'][name]['per_load_us'] * 1e3:.0f} ns per "
              "dependent load", flush=True)
        del chain

    # ---- streaming reads of each shape's INT2 bytes
    rows = []
    shapes = []
    if a.table:
        with open(a.table) as f:
            table = json.load(f)
        for r in table["rows"]:
            if "int2_bytes" in r:
                shapes.append(r)
    sizes = sorted({int(r["int2_bytes"]) for r in shapes}
                   | {int(float(s) * 1e6) for s in a.sizes_mb.split(",") if s})
    stream = {}
    buf = None
    for nbytes in sizes:
        best = None
        for progs, block, st in stream_configs(nbytes, sms):
            n = nbytes // 4
            per = math.ceil(n / progs / block) * block
            need = per * progs
            if buf is None or buf.numel() < need:
                buf = None
                torch.cuda.empty_cache()
                buf = torch.ones(max(need, 1 << 20), dtype=torch.int32, device=dev)
            outp = torch.empty(progs, dtype=torch.int32, device=dev)
            r = time_cuda(lambda: _stream[(progs,)](buf, outp, per, BLOCK=block, STAGES=st,
                                                    num_warps=8), rep=a.rep)
            us = r["median_ms"] * 1e3
            if best is None or us < best[0]:
                best = (us, f"{progs}x{block}x{st}", need * 4)
        stream[nbytes] = {"us": best[0], "config": best[1], "bytes_read": best[2],
                          "TBps": nbytes / (best[0] * 1e-6) / 1e12}
        print(f"[stream] {nbytes / 1e6:9.1f} MB {best[0]:8.1f} us "
              f"{stream[nbytes]['TBps']:.2f} TB/s ({best[1]})", flush=True)
    res["stream"] = {str(k): v for k, v in stream.items()}

    for r in shapes:
        s = stream[int(r["int2_bytes"])]
        t = targets(r, ceiling)
        rows.append(dict(preset=r["preset"], batch=r["batch"], context=r["context"],
                         int2_MB=round(r["int2_bytes"] / 1e6, 1),
                         stream_us=round(s["us"], 1),
                         stream_pct=round(100 * s["TBps"] / ceiling),
                         t80_us=round(t["t80_us"], 1),
                         cute_us=round(r["cute_ms"] * 1e3, 1) if r.get("cute_ms") else None,
                         fi_us=round(r["fi_ms"] * 1e3, 1) if r.get("fi_ms") else None,
                         tfi_us=round(t["tfi_us"], 1) if "tfi_us" in t else None,
                         fi_factor=t.get("fi_factor")))
    res["rows"] = rows
    cols = ["preset", "batch", "context", "int2_MB", "stream_us", "stream_pct", "t80_us",
            "cute_us", "fi_us", "fi_factor", "tfi_us"]
    md = [f"Read ceiling {ceiling:.2f} TB/s (4 GiB). Empty kernel: "
          + ", ".join(f"{k} CTAs {v:.2f} us" for k, v in res["empty_us"].items())
          + ". Dependent 4-byte loads: "
          + ", ".join(f"{k} {v['per_load_us'] * 1e3:.0f} ns" for k, v in res["chase"].items())
          + ".", "",
          "stream_us: fastest Triton streaming sum over the shape's INT2 bytes (contiguous); "
          "t80_us: the time 80 % of the read ceiling needs; tfi_us: FlashInfer BF16 time / "
          "fi_factor (the issue's 3x at batch 1, 5x at >= 64K); cute_us / fi_us from --table.",
          "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        md.append("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |")
    text = "\n".join(md)
    print(text)
    if a.stem:
        write_results(a.stem, header, res, text, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
