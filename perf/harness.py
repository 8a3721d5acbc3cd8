"""One timing harness for every ``perf/bench_<op>.py``.

What it provides:

* :func:`time_cuda` — median GPU time of a callable. Each repetition is bracketed by CUDA
  events; with ``graph=True`` the callable is captured once into a CUDA graph and the
  events bracket one graph replay (no Python launch overhead in the number); with
  ``cold_l2=True`` a read of a buffer several times the L2 size runs before each
  repetition (a read, not a write, so no dirty lines are written back inside the timed
  region). A list of callables is rotated through (use it for rotating input buffers).
* :func:`measure_read_bandwidth` — the HBM read ceiling of this GPU in this run
  (a Triton streaming-sum kernel over a large buffer, cold L2), plus the copy rate.
* :func:`env_header` — GPU name, driver, torch/triton/CUDA versions, git commit, date,
  exact command: the header every result file starts with.
* :func:`write_results` — Markdown table + JSON into ``perf/results/``.

Bytes are counted by the caller (what the kernel must move: each input read once, each
output written once); ``TB/s = 1e12 bytes / s``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import statistics
import subprocess
import sys
from typing import Callable, Sequence

import torch

__all__ = ["time_cuda", "measure_read_bandwidth", "env_header", "write_results", "tbps",
           "markdown_table"]

_FLUSH: dict[int, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 50 << 20) or (50 << 20)
        n = max(256 << 20, 4 * l2) // 4
        _FLUSH[idx] = torch.ones(n, dtype=torch.float32, device=device)
    return _FLUSH[idx]


def _flush_l2(buf: torch.Tensor, sink: torch.Tensor) -> None:
    torch.sum(buf, dim=0, out=sink)


def time_cuda(fn: Callable[[], object] | Sequence[Callable[[], object]], *, warmup: int = 10,
              rep: int = 50, graph: bool = True, cold_l2: bool = True) -> dict:
    """Median GPU time of ``fn`` in milliseconds.

    Parameters
    ----------
    fn : callable or sequence of callables
        The work to time; a sequence is used round-robin (one callable per repetition),
        e.g. the same kernel over different input replicas.
    warmup : int
        Untimed calls before timing (compilation, autotuning, allocator warm-up).
    rep : int
        Timed repetitions; the median is reported.
    graph : bool
        Capture each callable into a CUDA graph and time its replay (launch overhead
        excluded as far as the GPU allows). Falls back to eager timing, reported in
        ``mode``, when capture fails.
    cold_l2 : bool
        Read a buffer of ``max(256 MiB, 4 x L2)`` before every repetition.

    Returns
    -------
    dict with ``median_ms``, ``mean_ms``, ``min_ms``, ``max_ms``, ``p20_ms``, ``p80_ms``,
    ``rep``, ``mode`` (``"graph"`` or ``"eager"``), ``cold_l2`` and ``graph_error`` when
    capture failed.
    """
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    device = torch.device("cuda", torch.cuda.current_device())
    for _ in range(max(1, warmup)):
        for f in fns:
            f()
    torch.cuda.synchronize()
    runners: list[Callable[[], object]] = fns
    mode, graph_error, graphs = "eager", None, []
    if graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for f in fns:
                    f()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for f in fns:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    f()
                graphs.append(g)
            runners = [g.replay for g in graphs]
            for r in runners:
                r()
            torch.cuda.synchronize()
            mode = "graph"
        except Exception as exc:  # noqa: BLE001 - report and time eagerly instead
            graph_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            torch.cuda.synchronize()
            runners = fns
    buf = _flush_buffer(device) if cold_l2 else None
    sink = torch.empty((), dtype=torch.float32, device=device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for i in range(rep):
        if buf is not None:
            _flush_l2(buf, sink)
        starts[i].record()
        runners[i % len(runners)]()
        ends[i].record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    out = {
        "median_ms": statistics.median(ts), "mean_ms": statistics.fmean(ts),
        "min_ms": ts[0], "max_ms": ts[-1], "p20_ms": ts[int(0.2 * (len(ts) - 1))],
        "p80_ms": ts[int(0.8 * (len(ts) - 1))], "rep": rep, "mode": mode, "cold_l2": cold_l2,
    }
    if graph_error:
        out["graph_error"] = graph_error
    del graphs
    return out


def profile_kernels(fn: Callable[[], object], iters: int = 20, *,
                    name_len: int = 100) -> dict[str, tuple[float, float]]:
    """Kernels one call of ``fn`` launches (torch profiler, eager, after one warm-up call).

    Returns ``{kernel name[:name_len]: (launches per call, device microseconds per call)}``.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total and e.count:
            out[e.key[:name_len]] = (e.count / iters, total / iters)
    return out


def tbps(nbytes: float, ms: float | None) -> float | None:
    """``nbytes`` moved in ``ms`` milliseconds, in TB/s (1e12 bytes per second)."""
    return nbytes / (ms * 1e-3) / 1e12 if ms and ms > 0 else None


def measure_read_bandwidth(nbytes: int = 4 << 30, *, rep: int = 30) -> dict:
    """The HBM read and copy ceilings of the current GPU, measured now.

    Read: ``torch.sum`` over an ``nbytes`` float32 buffer (a streaming reduction, the
    same kind of access as decode attention); copy: ``Tensor.copy_`` of half that size,
    counted as bytes read plus bytes written. Both cold-L2, median over ``rep``.

    Returns
    -------
    dict with ``read_TBps``, ``read_ms``, ``read_bytes``, ``copy_TBps``, ``copy_ms``,
    ``copy_bytes``.
    """
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.rand(nbytes // 4, dtype=torch.float32, device=device)
    sink = torch.empty((), dtype=torch.float32, device=device)
    r = time_cuda(lambda: torch.sum(x, dim=0, out=sink), warmup=5, rep=rep, graph=True,
                  cold_l2=True)
    half = x[: x.numel() // 2]
    y = torch.empty_like(half)
    c = time_cuda(lambda: y.copy_(half), warmup=5, rep=rep, graph=True, cold_l2=True)
    res = {"read_bytes": nbytes, "read_ms": r["median_ms"], "read_TBps": tbps(nbytes, r["median_ms"]),
           "copy_bytes": 2 * half.numel() * 4, "copy_ms": c["median_ms"],
           "copy_TBps": tbps(2 * half.numel() * 4, c["median_ms"])}
    del x, y, half
    torch.cuda.empty_cache()
    return res


def _git_commit() -> str:
    env = os.environ.get("OSCAR_GIT_COMMIT")
    if env:
        return env
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def env_header(command: str | None = None) -> dict:
    """Where and how a result was measured.

    The git commit comes from ``git rev-parse HEAD`` or, on a machine that received a
    copy of the working tree without ``.git``, from the ``OSCAR_GIT_COMMIT`` variable.
    """
    import triton  # noqa: PLC0415 - optional dependency of the package, needed here

    head = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": command or " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda_runtime": torch.version.cuda,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        head.update(gpu=props.name, sm_count=props.multi_processor_count,
                    compute_capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1),
                    l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1))
        try:
            head["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                 "--format=csv,noheader"], capture_output=True, text=True,
                timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            head["driver"] = "unknown"
    return head


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``columns`` = ``[(key, header, format)]``; missing values print as ``-``."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join(" --- " for _ in columns) + "|"]
    for r in rows:
        cells = []
        for key, _, fmt in columns:
            v = r.get(key)
            cells.append("-" if v is None else (format(v, fmt) if fmt else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(stem: str, header: dict, payload: dict, markdown: str,
                  out_dir: str | None = None) -> tuple[str, str]:
    """Write ``<out_dir>/<stem>.json`` (header + payload) and ``<stem>.md`` (header + text).

    ``out_dir`` defaults to ``perf/results`` next to this file. Returns both paths.
    """
    out_dir = out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    jpath = os.path.join(out_dir, stem + ".json")
    mpath = os.path.join(out_dir, stem + ".md")
    with open(jpath, "w") as f:
        json.dump({"env": header, **payload}, f, indent=1, default=str)
    env_lines = "\n".join(f"- {k}: `{v}`" for k, v in header.items())
    with open(mpath, "w") as f:
        f.write(f"# {stem}\n\n{env_lines}\n\n{markdown}\n")
    return jpath, mpath
