"""Report of run_all.sh: generated texts, first divergence, logprob differences.

    python perf/sglang_cpu/compare.py results/sglang/serve_smollm2_cpu

Reads every ``*.json`` written by serve_compare.py / hf_reference.py in the directory.
"""

from __future__ import annotations

import json
import os
import statistics
import sys


def load(d, name):
    p = os.path.join(d, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def by_name(run, rnd=0):
    return {r["name"]: r for r in run["results"] if r["round"] == rnd}


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def fmt_div(i, n):
    return "same" if i is None else f"{i}"


def mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


def pair_table(runs, a, b, title, rnd_b=0):
    """Per prompt: first divergence of b vs a; mean |dlogprob| on the common prefix."""
    ra, rb = runs.get(a), runs.get(b)
    if ra is None or rb is None:
        return [f"{title}: missing ({a if ra is None else b})", ""]
    A, B = by_name(ra), by_name(rb, rnd_b)
    lines = [f"{title}  [{b}{'' if rnd_b == 0 else f' round {rnd_b}'} vs {a}]",
             "  prompt  first-divergent-token  mean|dlogprob| before it  max|dlogprob| before it"]
    divs, all_d = [], []
    for name in A:
        if name not in B:
            continue
        x, y = A[name], B[name]
        i = first_diff(x["output_ids"], y["output_ids"])
        n = len(x["output_ids"]) if i is None else i
        d = [abs(p - q) for p, q in zip(x["output_logprobs"][:n], y["output_logprobs"][:n])]
        all_d += d
        divs.append(len(x["output_ids"]) if i is None else i)
        lines.append(f"  {name:6s}  {fmt_div(i, len(x['output_ids'])):>21s}  "
                     f"{mean(d):24.4f}  {max(d) if d else float('nan'):23.4f}")
    same = sum(1 for n in A if n in B and A[n]["output_ids"] == B[n]["output_ids"])
    lines.append(f"  => identical generations {same}/{len(divs)}, mean first divergence "
                 f"{mean(divs):.1f} tokens (no divergence counted as the full length), "
                 f"mean |dlogprob| before divergence {mean(all_d):.4f}")
    lines.append("")
    return lines


def forced_table(runs, ref_name, entries):
    """Teacher-forced NLL of the reference run's tokens under several runs."""
    ref = runs.get(ref_name)
    if ref is None:
        return []
    lines = [f"Teacher-forced: logprobs of {ref_name}'s generated tokens (prompt + continuation "
             "as ONE prefill) under each run, tokens 1..N-1 (SGLang returns no logprob for the first "
             "token of the range); mean NLL per token (lower = closer to the "
             "reference's own choices), mean |dlogprob| vs the reference's decode-time logprobs",
             "  run                              mean NLL   mean|dlogprob| vs " + ref_name]
    R = by_name(ref)
    base = [lp for r in R.values() for lp in r["output_logprobs"][1:]]
    lines.append(f"  {ref_name + ' (decode-time)':32s} {-mean(base):9.4f}  {0.0:10.4f}")
    for label, run_name, key in entries:
        run = runs.get(run_name)
        if run is None or not run.get(key):
            continue
        lps, diffs = [], []
        for f in run[key]:
            if f["name"] not in R:
                continue
            pairs = list(zip(f["logprobs"], R[f["name"]]["output_logprobs"]))[1:]
            lps += [p for p, _ in pairs]
            diffs += [abs(p - q) for p, q in pairs]
        lines.append(f"  {label:32s} {-mean(lps):9.4f}  {mean(diffs):10.4f}")
    lines.append("")
    return lines


def self_consistency(runs, name):
    run = runs.get(name)
    if run is None or not run.get("self_forced"):
        return []
    R = by_name(run)
    d = [abs(p - q) for f in run["self_forced"]
         for p, q in list(zip(f["logprobs"], R[f["name"]]["output_logprobs"]))[1:]]
    return [f"Self-consistency of {name}: its own generated tokens re-scored as one prefill vs "
            f"their decode-time logprobs: mean |dlogprob| {mean(d):.4f}, max {max(d):.4f} "
            f"over {len(d)} tokens", ""]


def main() -> int:
    d = sys.argv[1] if len(sys.argv) > 1 else "results/sglang/serve_smollm2_cpu"
    names = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json"))
    runs = {n: load(d, n) for n in names}
    out = []
    first = runs.get("bf16_batch") or next(iter(runs.values()))
    m = first["meta"]
    out += [f"# SmolLM2-135M-Instruct served by SGLang {m.get('sglang')} on the CPU "
            f"(torch {m.get('torch')}): BF16 KV cache vs --kv-cache-dtype int2",
            f"# runs in {d} (JSON per run, logs/ has each engine's log); report made by "
            "perf/sglang_cpu/compare.py", ""]
    out.append("Runs:")
    for n, r in runs.items():
        mm = r["meta"]
        ek = mm.get("engine_kwargs", {})
        extra = {k: ek[k] for k in ("kv_cache_dtype", "page_size", "disable_radix_cache",
                                    "chunked_prefill_size") if k in ek}
        env = {k[6:].lower(): v for k, v in mm.get("oscar_env", {}).items()
               if k in ("OSCAR_SINK_SIZE", "OSCAR_RECENT_SIZE")}
        out.append(f"  {n:22s} {mm['date']}  startup {mm.get('startup_s', '-')} s, generate "
                   f"{mm.get('generate_s')} s  {extra} {env}")
        out.append(f"  {'':22s} {' '.join(mm['argv'][1:])}")
    out.append("")

    # texts
    base = runs.get("bf16_batch")
    if base:
        out.append("Generated texts (greedy, temperature 0, ignore_eos), bf16_batch vs int2_batch "
                   "(sink 4 / recent 32) vs int2_default_batch (sink 64 / recent 256):")
        for name, r in by_name(base).items():
            out.append(f"  --- {name} ({r['prompt_len']} prompt tokens)")
            for run_name in ("bf16_batch", "hf_bf16", "int2_batch", "hf_int2",
                             "int2_default_batch", "int2_allbf16_batch"):
                run = runs.get(run_name)
                if run and name in by_name(run):
                    x = by_name(run)[name]
                    i = first_diff(r["output_ids"], x["output_ids"])
                    out.append(f"  {run_name:20s} [div@{fmt_div(i, 0):>4s}] {x['text']!r}")
        out.append("")

    out.append("First divergence and logprob differences (greedy token ids compared position "
               "by position; |dlogprob| = |logprob of the generated token| difference while both "
               "runs generated the same tokens)")
    out.append("")
    for a, b, title in (
            ("bf16_batch", "hf_bf16", "Noise floor: SGLang BF16 vs HF transformers BF16"),
            ("bf16_batch", "bf16_seq", "Noise floor: SGLang BF16 batch of 8 vs one at a time"),
            ("bf16_batch", "bf16_batch_chunk64", "Noise floor: SGLang BF16 chunked prefill 64"),
            ("bf16_seq", "bf16_radix_seq", "SGLang BF16 radix cache on (round 0) vs off"),
            ("bf16_batch", "int2_allbf16_batch",
             "Plumbing: int2 with recent 512 (every position BF16) vs BF16"),
            ("bf16_batch", "int2_batch", "INT2 (sink 4 / recent 32) vs BF16"),
            ("bf16_batch", "int2_default_batch", "INT2 (sink 64 / recent 256) vs BF16"),
            ("hf_bf16", "hf_int2", "HF reference: OscarCache INT2 (sink 4 / recent 32) vs HF BF16"),
            ("hf_int2", "int2_batch", "SGLang int2 vs HF OscarCache int2 (same format/settings)"),
            ("int2_batch", "int2_seq", "INT2: batch of 8 vs one at a time"),
            ("int2_batch", "int2_batch_chunk64", "INT2: chunked prefill 64 vs one prefill"),
            ("int2_batch", "int2_page16_batch", "INT2: --page-size 16 vs 1"),
            ("int2_seq", "int2_radix_seq", "INT2: radix cache on (round 0) vs off"),
    ):
        out += pair_table(runs, a, b, title)
    for base_name in ("bf16_radix_seq", "int2_radix_seq"):
        if base_name in runs:
            out += pair_table(runs, base_name, base_name,
                              f"{base_name}: round 1 (prefix hits) vs round 0", rnd_b=1)
            cached = [(r["name"], r["cached_tokens"]) for r in runs[base_name]["results"]]
            out.append(f"  cached_tokens per request (round 0 then round 1): {cached}")
            out.append("")

    out += self_consistency(runs, "bf16_batch")
    out += self_consistency(runs, "int2_batch")
    out += self_consistency(runs, "hf_bf16")
    out += self_consistency(runs, "hf_int2")
    out += forced_table(runs, "bf16_batch", [
        ("bf16_batch (self, one prefill)", "bf16_batch", "self_forced"),
        ("hf_bf16", "hf_bf16", "forced"),
        ("int2_batch (4/32)", "int2_batch", "forced"),
        ("hf_int2 emulation (4/32)", "hf_int2", "forced"),
        ("int2_default_batch (64/256)", "int2_default_batch", "forced"),
    ])
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
