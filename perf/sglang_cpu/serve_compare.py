"""Serve SmolLM2-135M through SGLang on the CPU and record greedy generations + logprobs.

One run = one ``sglang.Engine`` (BF16 KV cache with SGLang's ``torch_native`` attention, or
``--kv-cache-dtype int2``: the oscar_kernels plugin), one JSON file. ``compare.py`` turns
several JSON files into the report. How to run: perf/sglang_cpu/README.md.

The CPU needs one stand-in (``perf/sglang_cpu/shim``: ``vllm._custom_ops.rotary_embedding``,
imported but not called by SGLang's RoPE on this platform); ``run_all.sh`` puts it on
``PYTHONPATH``, so SGLang's scheduler process inherits it. Nothing here touches attention
or the KV cache.

Prompts (all given as token ids, so every run sees identical inputs):

* ``shk0..shk3``: 320-token passages of Shakespeare's *Macbeth* and *The Tempest*
  (Project Gutenberg texts shipped in ``oscar_kernels/calibration/texts``), BOS first;
* ``qa0..qa3``: one plain-English story (about 250 tokens) followed by four different
  questions, in the model's chat template (a shared prefix: with the radix cache on and ``--mode seq`` requests 1-3
  reuse request 0's prefix).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TEXTS = os.path.join(REPO, "oscar_kernels", "calibration", "texts")

STORY = (
    "Mara Ellison grew up in a small fishing town on the northern coast, where her father "
    "repaired boats and her mother taught mathematics at the only school. When Mara was "
    "twelve, a storm destroyed the harbour, and the family moved inland to the city of "
    "Dunmore. There she discovered the public library, a tall stone building with a green "
    "copper roof, and she spent every afternoon reading about rivers, bridges and machines. "
    "At nineteen she left Dunmore to study civil engineering at the university in Halstead. "
    "Her first real project, finished when she was twenty-six, was a footbridge of pale "
    "timber across the Caldon River; it is still used by more than two thousand people "
    "every day. Later she designed the new harbour wall of her home town, so that the boats "
    "her father had repaired would be safe from storms. She kept a small grey cat named "
    "Pepper, who slept on her drawings, and every summer she returned to the coast to swim "
    "in the cold sea. Her colleagues remember her as patient, precise and quietly funny, "
    "and her students still tell the story of the day she rebuilt a model bridge from "
    "matches during a lecture to show why a truss carries its load.\n\n")
QUESTIONS = [
    "Question: In which city did Mara discover the public library?\nAnswer:",
    "Question: What did Mara's father do for a living?\nAnswer:",
    "Question: What was the name of Mara's cat, and where did it sleep?\nAnswer:",
    "Question: Across which river did Mara build her first footbridge, and of what "
    "material?\nAnswer:",
]


def build_prompts(tokenizer, shk_tokens: int = 320) -> list[tuple[str, list[int]]]:
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    prompts = []
    for name, play, start in (("shk0", "macbeth_gut.txt", "ACT I."),
                              ("shk1", "macbeth_gut.txt", "ACT III."),
                              ("shk2", "tempest_gut.txt", "ACT 1\n"),
                              ("shk3", "tempest_gut.txt", "ACT 3\n")):
        with open(os.path.join(TEXTS, play), encoding="utf-8") as f:
            text = f.read()
        text = text[text.index(start):]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:shk_tokens - len(bos)]
        prompts.append((name, bos + ids))
    for i, q in enumerate(QUESTIONS):
        # the Instruct model's chat template (system prompt + user turn + assistant header)
        ids = tokenizer.apply_chat_template([{"role": "user", "content": STORY + q}],
                                            tokenize=True, add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        prompts.append((f"qa{i}", list(ids)))
    return prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2_hf")
    ap.add_argument("--kv", choices=("bf16", "int2"), required=True)
    ap.add_argument("--mode", choices=("batch", "seq"), default="batch",
                    help="batch: all prompts in one generate call; seq: one request at a time")
    ap.add_argument("--rounds", type=int, default=1,
                    help="send the prompts this many times (round >= 1 hits the radix cache)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--chunked-prefill-size", type=int, default=None)
    ap.add_argument("--radix", action="store_true", help="keep the radix cache on")
    ap.add_argument("--sink", type=int, default=4, help="OSCAR_SINK_SIZE (int2 only)")
    ap.add_argument("--recent", type=int, default=32, help="OSCAR_RECENT_SIZE (int2 only)")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    ap.add_argument("--oscar-backend", default="auto")
    ap.add_argument("--rotation-path", default=None)
    ap.add_argument("--prompts", default=None, help="comma list of prompt names (default all)")
    ap.add_argument("--forced", default=None,
                    help="JSON of an earlier run: also score its generated tokens "
                         "(teacher forcing, prompt + continuation as one prefill)")
    ap.add_argument("--self-forced", action="store_true",
                    help="also score this run's own generated tokens teacher-forced")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.kv == "int2":
        os.environ["OSCAR_SINK_SIZE"] = str(args.sink)
        os.environ["OSCAR_RECENT_SIZE"] = str(args.recent)
        os.environ["OSCAR_TOKENS_PER_REQUEST"] = "512"   # enough request rows for 8 prompts
        os.environ["OSCAR_BACKEND"] = args.oscar_backend
        if args.rotation_path:
            os.environ["OSCAR_ROTATION_PATH"] = args.rotation_path

    import sglang
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = build_prompts(tok)
    if args.prompts:
        keep = args.prompts.split(",")
        prompts = [p for p in prompts if p[0] in keep]

    engine_kwargs = dict(
        model_path=args.model, device="cpu", attention_backend="torch_native",
        kv_cache_dtype="int2" if args.kv == "int2" else "auto", dtype="bfloat16",
        disable_cuda_graph=True, max_total_tokens=args.max_total_tokens,
        context_length=2048, mem_fraction_static=0.3, page_size=args.page_size,
        disable_radix_cache=not args.radix, sampling_backend="pytorch",
        skip_server_warmup=True, log_level="info", random_seed=0)
    if args.chunked_prefill_size:
        engine_kwargs["chunked_prefill_size"] = args.chunked_prefill_size
    t0 = time.time()
    engine = sglang.Engine(**engine_kwargs)
    startup = time.time() - t0
    sp = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}

    def run(batch):
        return engine.generate(input_ids=[ids for _, ids in batch], sampling_params=sp,
                               return_logprob=True)

    results, timings = [], []
    for rnd in range(args.rounds):
        t = time.time()
        outs = run(prompts) if args.mode == "batch" else [run([p])[0] for p in prompts]
        timings.append(time.time() - t)
        for (name, ids), o in zip(prompts, outs):
            mi = o["meta_info"]
            results.append({
                "round": rnd, "name": name, "prompt_len": len(ids), "text": o["text"],
                "output_ids": o["output_ids"],
                "output_logprobs": [lp for lp, _tid, _ in mi["output_token_logprobs"]],
                "cached_tokens": mi.get("cached_tokens"),
            })

    def score(name, ids, cont):
        """Logprobs of ``cont`` after ``ids``, teacher-forced: one prefill of both.
        SGLang returns ``None`` for the first position of the range (``cont[0]``)."""
        o = engine.generate(input_ids=[ids + cont], sampling_params={
            "temperature": 0.0, "max_new_tokens": 1},
            return_logprob=True, logprob_start_len=len(ids))
        lps = [lp for lp, _tid, _ in o[0]["meta_info"]["input_token_logprobs"]]
        assert len(lps) == len(cont), (name, len(lps), len(cont))
        return lps

    forced, self_forced = [], []
    if args.forced:
        with open(args.forced) as f:
            ref = {r["name"]: r for r in json.load(f)["results"] if r["round"] == 0}
        for name, ids in prompts:
            forced.append({"name": name, "ref": args.forced,
                           "logprobs": score(name, ids, ref[name]["output_ids"])})
    if args.self_forced:
        own = {r["name"]: r for r in results if r["round"] == 0}
        for name, ids in prompts:
            self_forced.append({"name": name, "logprobs":
                                score(name, ids, own[name]["output_ids"])})

    engine.shutdown()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv, "sglang": sglang.__version__, "torch": torch.__version__,
        "engine_kwargs": engine_kwargs,
        "oscar_env": {k: v for k, v in os.environ.items() if k.startswith("OSCAR_")},
        "startup_s": round(startup, 1), "generate_s": [round(x, 1) for x in timings],
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results, "forced": forced,
                   "self_forced": self_forced}, f, indent=1)
    print(json.dumps(meta, indent=1))
    for r in results:
        print(f"[{r['round']}] {r['name']} ({r['prompt_len']} tok, cached {r['cached_tokens']}):"
              f" {r['text']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
