"""Phase timeline of the CuTe INT2 decode kernel, from %globaltimer stamps in a debug build.

Where a batch-1 or batch-8 call spends its time is not visible in a kernel's total: this
reads, per CTA, when it started, finished the query rotation (with the geometry, page-id
and ring-prologue loads before it), the INT2 chunk loop (with the warp's first BF16 window
chunk before it), the other BF16 window chunks, the
combine + partial stores, the ticket, and (last CTA of a sequence / KV head) the split
merge. Build a bundle with the trace stores first (they are compiled out otherwise):

    CUTE_DSL_ARCH=sm_90a python -m oscar_kernels.cute.aot build --debug trace \\
        --out trace_bundle --head-dims 128 --cuda "$CUDA_HOME"
    OSCAR_CUTE_BUNDLE=trace_bundle PYTHONPATH=. python perf/trace_decode.py \\
        --model qwen3-8b --batch 8 --context 8192 65536

The bundle's manifest records its debug flags, and the launcher makes room for the stamps
in its ticket buffers when it loads a trace build. A bundle built with ``--debug trace,pro``
also stamps when each CTA's prologue
loads arrived (geometry, first page id, ``R_K`` operand, q) and when its query rotation was
done ("prologue:" rows, from the CTA's own start); one built with ``trace,ramp`` (run with
``--ramp``) when warp 0's INT2 chunks 0, 8, 16 and 24 had arrived ("ramp:" rows); one
built with ``trace,clk`` (run with ``--clock``) the SM's ``%clock64`` at each CTA's INT2-loop
start and end (the "SM clock in the INT2 loop" row: cycles over timer nanoseconds).
``--plan WARPS:SPLITS[:mc]`` traces another plan than the shipped one (as
perf/tools/split_sweep_graph.py).

Timestamps have the timer's resolution (0.256 us on an H200); each phase prints min /
median / p90 / max over CTAs in microseconds. The call is the fourth of four (warm code),
each prepared as perf/harness.py's ``time_cuda`` prepares a timed repetition: the trace slots
zeroed, then L2 flushed by *reading* time_cuda's buffer (256 MB or 4 x L2), then one
CUDA-graph replay of the call (``--eager``: the call launched directly, and
``--write-flush``: L2 flushed by writing the buffer, which leaves it full of dirty lines the
call then has to evict; kernel times up to 2 us longer at batch 1 than the graph replays of
the same call).

The merge-CTA build (qwen3-8b batch 1's plan) has no slots for its merge
CTAs: their merge-tail stamps (8-10) land in the slot of the last split of their sequence
and KV head, and no split CTA merges; the "merge CTA:" rows then time them from the pair's
last count (the latest stamp 5 of its splits). ``--plan 8:16`` (merge CTAs off) traces the
fused-tail path there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

# stamps 11-15 of trace,pro builds, from the CTA's own start
PROLOGUE = ("prologue: geometry in", "prologue: first page id in", "prologue: R_K operand in",
            "prologue: q in", "prologue: rotation done")
# ... or, in trace,ramp builds, when warp 0's INT2 chunks 0 / 8 / 16 / 24
# had arrived (its loop's waits)
RAMP = ("ramp: warp 0 chunk 0 in", "ramp: chunk 8 in", "ramp: chunk 16 in",
        "ramp: chunk 24 in")
PHASES = [("rotation", 0, 1), ("int2 loop", 1, 2), ("window", 2, 3), ("combine", 3, 4),
          ("ticket", 4, 5)]


def _stats(x: torch.Tensor) -> dict:
    if x.numel() == 0:
        return {}
    s = x.sort().values
    n = s.numel()
    return {"min": float(s[0]), "med": float(s[n // 2]), "p90": float(s[min(n - 1, int(n * 0.9))]),
            "max": float(s[-1])}


def sm_idle(end: torch.Tensor, sm: torch.Tensor) -> dict:
    """How long each SM that ran CTAs sat idle before the call's last CTA ended.

    ``end``: per-CTA end stamps (us, NaN for missing), ``sm``: per-CTA SM ids. Returns the
    order statistics of ``max(end) - (the SM's last end)`` over SMs with CTAs and
    ``idle_fraction``: their mean over ``max(end)`` -- the share of SM time a perfectly
    balanced split of the same work would give back (at most; the work itself would not
    speed up)."""
    e = end.nan_to_num(float("-inf"))
    last = torch.full((int(sm.max()) + 1,), float("-inf"), dtype=e.dtype)
    last = last.scatter_reduce(0, sm.long(), e, reduce="amax")
    last = last[torch.isfinite(last)]
    idle = float(last.max()) - last
    out = _stats(idle)
    out["idle_fraction"] = float(idle.mean()) / float(last.max())
    return out


def trace_call(model: str, batch_size: int, context: int, page_size: int = 16,
               graph: bool = True, write_flush: bool = False, plan: str = "auto",
               ramp: bool = False, clock: bool = False) -> dict:
    from cute_bench import MODELS, make_cache

    from oscar_kernels import CacheSpec, LayerRotation, ops
    from oscar_kernels.cute import workspace
    from oscar_kernels.cute.config import RANK_MAX_SPLITS, TRACE_OFFSET, TRACE_WARP_OFFSET
    from oscar_kernels.cute.launch import decode
    from oscar_kernels.cute.plan import launch_op, wide_available
    from oscar_kernels.cute.plan import plan as shapes_plan

    hq, h, d = MODELS[model]
    # the ticket buffers are reallocated with room for the trace slots (128 B per CTA, 16 B
    # per warp): the launcher sees the trace build in the bundle's manifest
    workspace._COUNTERS.clear()
    workspace._SPARES.clear()
    dev = torch.device("cuda")
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=page_size, kv_layout="HND")
    rot = LayerRotation.hadamard(d).to(dev)
    cache, table = make_cache(spec, batch_size, context, dev)
    q = torch.randn(batch_size, hq, d, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(q)
    warps, splits = shapes_plan(batch_size, h, torch.cuda.get_device_properties(dev)
                                .multi_processor_count, hq // h, d,
                                wide_available(hq // h, d))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
    from split_sweep_graph import plan_kwargs
    kw = plan_kwargs(plan, hq // h, d)        # "auto": the shipped plan (decode_steps' choice)
    warps, splits = kw.get("warps", warps), kw.get("num_splits", splits)
    rk, rv = rot.per_head(h)
    from harness import _flush_buffer, _flush_l2     # time_cuda's cold-L2 flush
    flush = _flush_buffer(dev)
    sink = torch.empty((), dtype=torch.float32, device=dev)
    ncta = batch_size * h * splits

    def call():
        if kw:
            decode(q, cache, *table, rk, rv, d ** -0.5, out=out, **kw)
        else:
            ops.paged_decode_attention(q, cache, *table, rot, out=out, backend="cute",
                                       check_bounds=False)
    call()                       # allocates the ticket / trace buffers, fills caches
    torch.cuda.synchronize()
    run = call
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call()
        run = g.replay
    for _ in range(4):
        for buf in workspace._COUNTERS.values():
            buf[TRACE_OFFSET // 4:].zero_()
        if write_flush:
            flush.fill_(1.0)
        else:
            _flush_l2(flush, sink)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
    # the buffer this call used (the graph's capture stream has one of its own)
    bufs = [t for t in workspace._COUNTERS.values() if t.numel() > TRACE_OFFSET // 4 + ncta * 32]
    buf = max(bufs, key=lambda t: int((t[TRACE_OFFSET // 4: TRACE_OFFSET // 4 + ncta * 32]
                                       != 0).sum()))
    slots16 = buf[TRACE_OFFSET // 4: TRACE_OFFSET // 4 + ncta * 32].view(torch.int64)
    slots16 = slots16.view(ncta, 16).cpu()
    slots = slots16[:, :8]
    if int((slots[:, 0] == 0).sum()):
        raise RuntimeError("no trace stamps: is OSCAR_CUTE_BUNDLE a bundle built with "
                           "--debug trace?")
    t = slots[:, :7].double()
    t = torch.where(slots[:, :7] == 0, torch.full_like(t, float("nan")), t)
    t = (t - t[:, 0].min()) / 1e3                       # us since the first CTA started
    row = {"model": model, "batch": batch_size, "context": context, "plan": plan,
           "warps": warps, "splits": splits, "graph": graph, "write_flush": write_flush,
           "ctas": ncta, "event_us": start.elapsed_time(end) * 1e3,
           "start": _stats(t[:, 0])}
    for name, a, b in PHASES:
        dt = t[:, b] - t[:, a]
        row[name] = _stats(dt[~torch.isnan(dt)])
    tail = t[:, 6] - t[:, 5]
    merged = tail > 0.3                                  # the CTAs that ran the merge
    # the merge-CTA build (decode's choice): no split CTA merges
    merge_ctas = launch_op(batch_size, h, hq // h, d, warps, splits, dev,
                           merge_ctas=kw.get("merge_ctas"),
                           ring4=kw.get("ring4")) == "decode_pair_mc"
    row["merge CTAs"] = bool(merge_ctas)
    if merge_ctas:
        merged = torch.zeros_like(merged)
    row["merge tail (last CTA)"] = _stats(tail[merged & ~torch.isnan(tail)])
    row["end"] = _stats(t[:, 6])
    _merge_tail_rows(row, t, slots, slots16, splits, merge_ctas)
    # --debug trace,clk builds: %clock64 at the INT2 loop's start and end (slots
    # 11, 12): the SM clock over each CTA's loop (cycles / globaltimer ns)
    if clock:
        cyc = (slots16[:, 12] - slots16[:, 11]).double()
        ns = (slots[:, 2] - slots[:, 1]).double()
        ok = (slots16[:, 11] != 0) & (slots16[:, 12] != 0) & (ns > 2000)
        if not int(ok.sum()):
            raise RuntimeError("no clock stamps: is OSCAR_CUTE_BUNDLE an "
                               "--debug trace,clk build?")
        row["SM clock in the INT2 loop (MHz)"] = _stats(1e3 * cyc[ok] / ns[ok])
    # trace,pro builds: stamps 11-15, when the CTA's prologue loads had
    # arrived (geometry, first page id, R_K operand, q) and its query rotation was done
    pro = slots16[:, 11:16].double()
    if int((pro[:, 0] != 0).sum()) and not clock:
        pro = torch.where(slots16[:, 11:16] == 0, torch.full_like(pro, float("nan")), pro)
        pro = (pro - slots[:, 0:1].double()) / 1e3        # us since the CTA's own start
        for k, name in enumerate(RAMP if ramp else PROLOGUE):
            v = pro[:, k]
            row[name] = _stats(v[~torch.isnan(v)])
        row["per CTA prologue stamps us"] = [[None if x != x else round(float(x), 2)
                                              for x in r] for r in pro]
    # per SM: mean INT2-loop time of its CTAs (equal work per CTA: the spread is the SMs')
    sm = (slots[:, 7] & 0xFFFFFFFF).long()
    loop = t[:, 2] - t[:, 1]
    per_sm = torch.zeros(int(sm.max()) + 1, dtype=torch.float64).index_add_(0, sm, loop)
    cnt = torch.zeros_like(per_sm).index_add_(0, sm, torch.ones_like(loop))
    per_sm = per_sm / cnt.clamp(min=1)
    row["int2 loop per SM (mean us, by smid)"] = [round(float(x), 2) for x in per_sm]
    row["CTAs per SM"] = [int(x) for x in cnt]
    # per CTA (index (b * kv_heads + h) * splits + split): smid, INT2-loop time
    row["per CTA smid"] = [int(x) for x in sm]
    row["per CTA int2 loop us"] = [round(float(x), 2) for x in loop]
    row["SM idle before the last CTA ends"] = sm_idle(t[:, 6], sm)
    row["SM idle before the last INT2 loop ends"] = sm_idle(t[:, 2], sm)
    row["per CTA stamps us"] = [[None if x != x else round(float(x), 2) for x in r] for r in t]
    row["last CTA to end"] = [round(float(x), 2) for x in t[int(t[:, 6].nan_to_num(-1).argmax())]]
    # per warp (lane 0): INT2-loop start and work end (before the CTA's combine)
    w0 = (TRACE_OFFSET + TRACE_WARP_OFFSET) // 4
    ws = buf[w0: w0 + ncta * warps * 4].view(torch.int64).view(ncta, warps, 2).cpu()
    if int((ws[..., 1] == 0).sum()) == 0:
        tw = (ws.double() - slots[:, 0].double().min()) / 1e3
        busy = tw[..., 1] - tw[..., 0]                    # [cta, warp]
        row.update(warp_stats(tw[..., 1], busy, _dispatch_rank(
            batch_size, h, splits, warps, torch.cuda.get_device_properties(dev)
            .multi_processor_count,
            # the merge-CTA build's grid is split-major at any split count
            splits if merge_ctas else RANK_MAX_SPLITS)))
        row["per warp stamps us"] = [[[round(float(x), 2) for x in w] for w in c] for c in tw]
    return row


def _merge_tail_rows(row: dict, t, slots, slots16, splits: int, merge_ctas: bool) -> None:
    """Rows of the merge tail's stamps 8-10 (the CTAs that merged, or the merge CTAs)."""
    # inside the merge tail (stamps 8-10 of the CTAs that merged): first row block and the
    # split weights in, every block summed, B fragments of o', then R_V^T and the stores
    mt = slots16[:, 8:11].double()
    mt = torch.where(slots16[:, 8:11] == 0, torch.full_like(mt, float("nan")), mt)
    mt = (mt - slots[:, 0].double().min()) / 1e3
    has = ~torch.isnan(mt[:, 0])
    if int(has.sum()) and not merge_ctas:
        edges = torch.cat([t[has, 5:6], mt[has], t[has, 6:7]], dim=1)
        for k, name in enumerate(("tail: fence, first rows, weights", "tail: other rows, sums",
                                  "tail: o' B fragments", "tail: R_V^T, stores, ticket reset")):
            row[name] = _stats(edges[:, k + 1] - edges[:, k])
    row["per CTA tail stamps us"] = [[None if x != x else round(float(x), 2) for x in r]
                                     for r in mt]
    if merge_ctas:
        # the merge-CTA build: no split merges; the merge CTA of (b, h) stamps 8-10 into
        # the slot of split splits - 1. From the last split's count (the latest stamp 5 of
        # the pair's splits) to the merge CTA's rows + weights, sums and o' fragments
        last_count = t[:, 5].view(-1, splits).nan_to_num(float("-inf")).max(dim=1).values
        mc = mt.view(-1, splits, 3)[:, splits - 1]
        ok = ~torch.isnan(mc).any(dim=1)
        if int(ok.sum()):
            edges = torch.cat([last_count[ok, None], mc[ok]], dim=1)
            for k, name in enumerate(("merge CTA: count seen, rows, weights",
                                      "merge CTA: sums", "merge CTA: o' B fragments")):
                row[name] = _stats(edges[:, k + 1] - edges[:, k])
            row["merge CTA: last count"] = _stats(last_count[ok])
            row["merge CTA: o' fragments done"] = _stats(mc[ok, 2])


def _dispatch_rank(batch: int, heads: int, splits: int, warps: int, nsm: int,
                   rank_max_splits: int) -> torch.Tensor:
    """Per CTA (logical index ``(b * heads + h) * splits + s``) its dispatch rank on its SM
    in a single wave: ``L // nsm`` with ``L`` the linear block index (split-major grid
    ``(heads, batch, splits)`` for the wide build with few splits, else ``(splits, heads,
    batch)``)."""
    b = torch.arange(batch).view(-1, 1, 1)
    h = torch.arange(heads).view(1, -1, 1)
    s = torch.arange(splits).view(1, 1, -1)
    if warps == 8 and splits <= rank_max_splits:
        lin = h + heads * (b + batch * s)
    else:
        lin = s + splits * (h + heads * b)
    return (lin // nsm).reshape(-1)


def warp_stats(end: torch.Tensor, busy: torch.Tensor, rank: torch.Tensor) -> dict:
    """Intra-CTA balance from per-warp stamps: ``end`` / ``busy`` ``[cta, warp]`` (us; work
    end, and INT2 loop start to work end), ``rank`` per CTA. Returns the spread of warp ends
    within a CTA (last - first) and, per (dispatch rank, warp), the median of each warp's busy
    time over its CTA's median warp (equal shares: > 1 is a slower warp)."""
    spread = end.max(dim=1).values - end.min(dim=1).values
    rel = busy / busy.median(dim=1, keepdim=True).values
    out = {"warp end spread in CTA": _stats(spread)}
    by = {}
    for r in sorted(set(int(x) for x in rank)):
        m = rank == r
        if int(m.sum()) == 0:
            continue
        by[str(r)] = [round(float(rel[m, w].median()), 3) for w in range(busy.shape[1])]
    out["warp busy / CTA median, by rank"] = by
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[8])
    ap.add_argument("--context", type=int, nargs="+", default=[8192])
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    ap.add_argument("--eager", action="store_true", help="launch the call directly instead "
                    "of replaying a CUDA graph of it")
    ap.add_argument("--plan", default="auto", help="WARPS:SPLITS or WARPS:SPLITS:mc "
                    "(perf/tools/split_sweep_graph.py's plans), 'auto' the shipped plan")
    ap.add_argument("--ramp", action="store_true", help="the bundle is an "
                    "--debug trace,ramp build (stamps 11-14: warp 0's chunk arrivals)")
    ap.add_argument("--clock", action="store_true", help="the bundle is an "
                    "--debug trace,clk build (slots 11-12: %%clock64 at the INT2 loop's "
                    "start and end): print the SM clock over each CTA's loop")
    ap.add_argument("--write-flush", action="store_true", help="flush L2 by writing the "
                    "flush buffer (dirty lines) instead of reading it")
    a = ap.parse_args(argv)
    rows = []
    for b in a.batch:
        for n in a.context:
            row = trace_call(a.model, b, n, graph=not a.eager, write_flush=a.write_flush,
                             plan=a.plan, ramp=a.ramp, clock=a.clock)
            rows.append(row)
            print(f"{a.model} batch {b} context {n} (plan {a.plan}): {row['warps']} warps, "
                  f"{row['splits']} splits, {row['ctas']} CTAs, call {row['event_us']:.1f} us "
                  f"(events; {'graph replay' if row['graph'] else 'eager'}, L2 flushed by a "
                  f"{'write' if row['write_flush'] else 'read'})")
            tail_parts = [k for k in row if k.startswith(("tail: ", "merge CTA: "))]
            for k in (["start"] + [p for p in PROLOGUE + RAMP if p in row]
                      + [p[0] for p in PHASES]
                      + ["merge tail (last CTA)"] + tail_parts + ["end"]
                  + (["SM clock in the INT2 loop (MHz)"] if a.clock else [])):
                v = row[k]
                cols = ("min", "med", "p90", "max")
                print(f"  {k:22s} " + ("  ".join(f"{s} {v[s]:7.2f}" for s in cols) if v else "-"))
            for k in ("SM idle before the last CTA ends", "SM idle before the last INT2 loop ends"):
                v = row[k]
                print(f"  {k}: med {v['med']:.2f} p90 {v['p90']:.2f} max {v['max']:.2f} us, "
                      f"{100 * v['idle_fraction']:.1f} % of SM time")
            print(f"  last CTA to end (stamps 0-6, us): {row['last CTA to end']}")
            if "warp end spread in CTA" in row:
                v = row["warp end spread in CTA"]
                print("  warp end spread in CTA " + "  ".join(
                    f"{s} {v[s]:6.2f}" for s in ("min", "med", "p90", "max")))
                for r, x in row["warp busy / CTA median, by rank"].items():
                    print(f"  rank {r} warp busy / CTA median: " + " ".join(f"{y:.3f}" for y in x))
            sys.stdout.flush()
    if a.out:
        from harness import env_header
        with open(a.out, "w") as f:
            json.dump({"header": env_header(" ".join(sys.argv)), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
