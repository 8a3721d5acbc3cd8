"""Independent reference for serve_compare.py: the same prompts, greedy, through Hugging Face
``transformers`` (no SGLang), with the stock cache (BF16) or oscar_kernels' own packed INT2
cache (``integrations.transformers.OscarCache``: the same ops, the same Hadamard artifact and
sink/recent windows as the SGLang plugin, but none of the plugin's code).

It answers "is a difference between SGLang int2 and SGLang bf16 the INT2 format, or a bug in
the plugin?": SGLang-int2 should track HF-int2 about as closely as SGLang-bf16 tracks HF-bf16.
Writes the same JSON layout as serve_compare.py (``results``, ``forced``), so compare.py
reads both. One sequence at a time (OscarCache decodes a fixed, unpadded batch).

    python perf/sglang_cpu/hf_reference.py --kv int2 --sink 4 --recent 32 --out hf_int2.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_compare import build_prompts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2_hf")
    ap.add_argument("--kv", choices=("bf16", "int2"), required=True)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--recent", type=int, default=32)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--forced", default=None, help="JSON of a run whose generated tokens to "
                    "score teacher-forced (int2: the emulated read rule, one forward)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers
    from oscar_kernels.integrations.transformers import (Int2Scheme, OscarCache,
                                                         attach_scheme, model_fingerprint)
    from oscar_kernels.rotation import RotationArtifact

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    model.eval().requires_grad_(False)
    prompts = build_prompts(tok)
    if args.prompts:
        keep = args.prompts.split(",")
        prompts = [p for p in prompts if p[0] in keep]
    scheme = None
    if args.kv == "int2":
        art = RotationArtifact.hadamard(model_fingerprint(model.config))
        scheme = Int2Scheme.from_artifact(art, sink_size=args.sink, recent_size=args.recent,
                                          page_size=args.page_size)

    def greedy(ids):
        x = torch.tensor([ids])
        out_ids, lps = [], []
        if scheme is None:
            cache = transformers.DynamicCache()
        else:
            cache = OscarCache(model.config, scheme, max_batch_size=1,
                               max_cache_len=len(ids) + args.max_new_tokens + 1)
        with torch.no_grad():
            for _ in range(args.max_new_tokens):
                logits = model(x, past_key_values=cache, use_cache=True).logits[0, -1]
                lp = torch.log_softmax(logits.float(), -1)
                t = int(lp.argmax())
                out_ids.append(t)
                lps.append(float(lp[t]))
                x = torch.tensor([[t]])
        return out_ids, lps

    results, forced = [], []
    t0 = time.time()
    with (attach_scheme(model, scheme) if scheme is not None else _null()):
        for name, ids in prompts:
            out_ids, lps = greedy(ids)
            results.append({"round": 0, "name": name, "prompt_len": len(ids),
                            "text": tok.decode(out_ids), "output_ids": out_ids,
                            "output_logprobs": lps, "cached_tokens": 0})
            print(f"{name}: {tok.decode(out_ids)!r}", flush=True)
        if args.forced:
            with open(args.forced) as f:
                ref = {r["name"]: r for r in json.load(f)["results"] if r["round"] == 0}
            for name, ids in prompts:
                cont = ref[name]["output_ids"]
                with torch.no_grad():  # int2: teacher-forced emulation of the read rule
                    logits = model(torch.tensor([ids + cont])).logits[0].float()
                lp = torch.log_softmax(logits[len(ids) - 1:-1], -1)
                forced.append({"name": name, "ref": args.forced, "logprobs":
                               lp.gather(1, torch.tensor(cont)[:, None])[:, 0].tolist()})
        # self-consistency, as serve_compare.py --self-forced: the run's own tokens scored
        # as one prefill through the same cache (OscarCache: the packed extend op)
        self_forced = []
        for r, (name, ids) in zip(results, prompts):
            seq = ids + r["output_ids"]
            with torch.no_grad():
                if scheme is None:
                    logits = model(torch.tensor([seq])).logits[0].float()
                else:
                    cache = OscarCache(model.config, scheme, max_batch_size=1,
                                       max_cache_len=len(seq) + 1)
                    logits = model(torch.tensor([seq]), past_key_values=cache,
                                   use_cache=True).logits[0].float()
            lp = torch.log_softmax(logits[len(ids) - 1:-1], -1)
            self_forced.append({"name": name, "logprobs": lp.gather(
                1, torch.tensor(r["output_ids"])[:, None])[:, 0].tolist()})
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv, "transformers": transformers.__version__,
            "torch": torch.__version__, "generate_s": [round(time.time() - t0, 1)]}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results, "forced": forced,
                   "self_forced": self_forced}, f, indent=1)
    return 0


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
