"""CuTe decode plans (warps x splits, merge CTAs on / off) timed like the benchmark:
CUDA-graph replay, cold L2, median, in alternating rounds, with each plan's output checked
against the first plan's.

    PYTHONPATH=. python perf/tools/split_sweep_graph.py --model qwen3-8b --batch 1 \\
        --context 65536 131072 --plans 8:16:mc 8:16 8:32:mc --rounds 3

A plan is ``WARPS:SPLITS`` optionally followed by ``:mc`` (the merge-CTA build forced on;
without it forced off for wide pair calls) and/or ``:r4`` (the 4-deep ring pair build
forced on; without it forced off for pair calls at head_dim 128). ``auto`` is the shipped
plan with the context as its length hint (``max_kv_len``), ``shapes`` the shipped plan
from the shapes alone. Prints one line per round and plan (microseconds per context) and the largest
|o - o_first| per plan.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from oscar_kernels.cute.config import PAIR_MAX_GROUP


def plan_kwargs(plan: str, group: int, head_dim: int = 128) -> dict:
    """:func:`oscar_kernels.cute.launch.decode` overrides of a plan string: ``auto``, or
    ``WARPS:SPLITS`` with optional ``:mc`` (wide pair calls, GQA <= 4: the merge-CTA build
    forced on, else off) and ``:r4`` (pair calls at head_dim 128: the 4-deep ring build
    forced on, else off)."""
    if plan in ("auto", "shapes"):
        return {}
    parts = plan.split(":")
    flags = parts[2:]
    if (len(parts) < 2 or not all(p.isdigit() for p in parts[:2])
            or len(set(flags)) != len(flags) or not set(flags) <= {"mc", "r4"}):
        raise ValueError(f"plan: expected 'auto' or 'WARPS:SPLITS' with optional ':mc' and "
                         f"':r4', got {plan!r}")
    kw = {"warps": int(parts[0]), "num_splits": int(parts[1])}
    if kw["warps"] == 8 and group <= PAIR_MAX_GROUP:
        kw["merge_ctas"] = "mc" in flags
    if group <= PAIR_MAX_GROUP and head_dim == 128:
        kw["ring4"] = "r4" in flags
    elif "r4" in flags:
        raise ValueError(f"plan: ':r4' needs GQA <= {PAIR_MAX_GROUP} and head_dim 128, got "
                         f"{plan!r} for GQA {group}, head_dim {head_dim}")
    return kw


def main(argv=None) -> int:
    from cute_bench import MODELS, make_cache
    from harness import env_header, time_cuda

    from oscar_kernels import CacheSpec, LayerRotation
    from oscar_kernels.cute.launch import decode

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, nargs="+", default=[65536])
    ap.add_argument("--plans", nargs="+", default=["auto"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=20)
    a = ap.parse_args(argv)

    dev = torch.device("cuda")
    hq, h, d = MODELS[a.model]
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=16, kv_layout="HND")
    rk, rv = LayerRotation.hadamard(d).to(dev).per_head(h)
    command = " ".join(["perf/tools/split_sweep_graph.py"] + (argv or sys.argv[1:]))
    print("#", json.dumps(env_header(command)))

    kwargs = {plan: plan_kwargs(plan, hq // h, d) for plan in a.plans}   # malformed: fail now

    def call_kwargs(plan, n):     # `auto` gets the context as its length hint
        return dict(kwargs[plan], max_kv_len=n if plan == "auto" else None)
    cases = []
    for n in a.context:
        cache, table = make_cache(spec, a.batch, n, dev)
        q = torch.randn(a.batch, hq, d, dtype=torch.bfloat16, device=dev)
        outs = {}
        for plan in a.plans:
            out = torch.full_like(q, float("nan"))
            decode(q, cache, *table, rk, rv, d ** -0.5, out=out, **call_kwargs(plan, n))
            outs[plan] = out
        ref = outs[a.plans[0]].float()
        for plan in a.plans:
            err = (outs[plan].float() - ref).abs().max().item()
            print(f"# {a.model} b{a.batch} {n // 1024}K {plan}: "
                  f"max|o - o[{a.plans[0]}]| = {err:.3g}")
        cases.append((n, cache, table, q))
    for r in range(a.rounds):
        for plan in a.plans:
            times = []
            for n, cache, table, q in cases:
                out = torch.empty_like(q)
                kw = call_kwargs(plan, n)
                fn = lambda: decode(q, cache, *table, rk, rv, d ** -0.5, out=out, **kw)  # noqa
                ms = time_cuda(fn, warmup=5, rep=a.rep)["median_ms"]
                times.append(f"{n // 1024}K {1e3 * ms:.1f}")
            print(f"round {r} {a.model} b{a.batch} {plan}: " + " ".join(times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
