"""Per-SM CTA pairs of a trace_decode JSON (session 22): for each SM the dispatch ranks the
kernel assumes for its CTAs (linear index // #SMs, as trace_decode._dispatch_rank) and the
CTAs' INT2-loop times; prints the rank-combination histogram and loop times per combo."""
import collections
import json
import sys

sys.path.insert(0, "perf")
from trace_decode import _dispatch_rank  # noqa: E402

from oscar_kernels.cute import RANK_MAX_SPLITS  # noqa: E402
from oscar_kernels.cute.bench import MODELS  # noqa: E402

for path in sys.argv[1:]:
    for r in json.load(open(path))["rows"]:
        hq, h, d = MODELS[r["model"]]
        rank = _dispatch_rank(r["batch"], h, r["splits"], r["warps"], 132, RANK_MAX_SPLITS).tolist()
        sm = r["per CTA smid"]
        loop = r["per CTA int2 loop us"]
        start = [c[0] for c in r["per CTA stamps us"]]
        end = [c[6] for c in r["per CTA stamps us"]]
        by_sm = collections.defaultdict(list)
        for i, s in enumerate(sm):
            by_sm[s].append(i)
        combos = collections.defaultdict(list)
        for s, idx in by_sm.items():
            key = tuple(sorted(rank[i] for i in idx))
            combos[key].append(max(end[i] for i in idx if end[i] is not None))
        print(f"## {r['model']} b{r['batch']} ctx {r['context']} plan {r['plan']}: {r['ctas']} "
              f"CTAs, call {r['event_us']:.1f} us, {len(by_sm)} SMs, latest start "
              f"{max(start):.2f} us")
        for key in sorted(combos):
            e = sorted(combos[key])
            print(f"   ranks {key}: {len(e)} SMs, SM end min {e[0]:.1f} med {e[len(e) // 2]:.1f} "
                  f"max {e[-1]:.1f} us")
        for rk in sorted(set(rank)):
            lp = sorted(loop[i] for i in range(len(loop)) if rank[i] == rk)
            print(f"   rank {rk} CTAs: {len(lp)}, INT2 loop min {lp[0]:.1f} med "
                  f"{lp[len(lp) // 2]:.1f} max {lp[-1]:.1f} us")
