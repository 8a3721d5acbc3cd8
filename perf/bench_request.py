"""Whole requests on a model-shaped stack: a long prompt prefilled in chunks, then decode.

    PYTHONPATH=. python3 perf/bench_request.py --fi-site /tmp/fi_site --out perf/results

One request at batch 1 on the Qwen3-8B stack of perf/bench_e2e.py (36 layers, random bf16
weights, fused elementwise kernels): the prompt (``--prompts``, default 32K and 128K
tokens) is prefilled in chunks of ``--chunk`` tokens (each chunk runs every layer:
RMSNorm, QKV, q/k norm + RoPE, cache write + extend attention, output projection, MLP),
then ``--decode-steps`` greedy decode steps follow. Stacks:

* ``int2``: one ``Int2PagedKVCache`` per layer; prefill by ``ops.paged_extend_attention``
  (``backend="auto"``, one ``ops.plan_extend`` per chunk shared by the layers), decode by the step of perf/bench_e2e.py (append +
  ``ops.paged_decode_attention``, CUDA graph);
* ``bf16_cudnn``: a contiguous BF16 K/V buffer per layer; each chunk's K/V copied in and
  attended by torch's cuDNN attention (bottom-right causal from an unmasked call over the
  prefix plus a causal call over the chunk, merged by their log-sum-exp in torch), the GQA
  heads expanded per call when cuDNN does not take them; decode by FlashInfer over BF16
  pages (the chunk's K/V are written to both);
* ``bf16_flashinfer``: BF16 pages; prefill by FlashInfer's ``BatchPrefillWithPagedKVCache``
  (fa2), decode by FlashInfer.

Reported per (stack, prompt): time to first token (the whole prefill, CUDA events, eager;
one run after a warm-up chunk), the decode step time (CUDA-graph replay, median, at the
prompt length plus half the decode steps) and decode tokens/s, and the request total =
TTFT + decode steps x step time. The decode time is the measured step times the step
count: over 1,000 steps the context grows by under 1% of a 32K prompt.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "perf")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _cudnn_gqa_ok(dev) -> bool:
    """Whether torch's cuDNN attention takes fewer K/V heads than query heads, and right."""
    import torch
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, 8, 64, 64, device=dev, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 2, 96, 64, device=dev, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 2, 96, 64, device=dev, generator=g).to(torch.bfloat16)
    try:
        o = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False,
                                                               False, scale=0.125)[0]
    except Exception:  # noqa: BLE001 - not supported: expand the heads
        return False
    kk, vv = k.repeat_interleave(4, 1).float(), v.repeat_interleave(4, 1).float()
    ref = torch.softmax(q.float() @ kk.transpose(-1, -2) * 0.125, -1) @ vv
    return bool((o.float() - ref).abs().max() < 3e-2)


class Stack:
    """One attention stack: the prefill attention of a chunk and the decode attention."""

    def __init__(self, kind: str, cfg, max_len: int, dev, e2e, seed: int = 0):
        import torch
        self.kind, self.cfg, self.dev, self.e2e = kind, cfg, dev, e2e
        ps = 16
        pages = -(-max_len // ps)
        self.table = e2e.PageTable(1, max_len, ps, pages, dev, seed=seed)
        if kind == "int2":
            spec = e2e.int2_spec(cfg, ps, None, "HND")
            self.attn = e2e.Int2PagedAttention(cfg, spec, num_pages=pages, num_window_slots=1,
                                               device=dev, seed=seed)
        else:
            self.attn = e2e.Bf16PagedAttention(cfg, page_size=ps, num_pages=pages, device=dev,
                                               kernel="flashinfer")
        self.attn.fill_random(seed + 1)
        self.attn.check_bounds = False
        if kind == "bf16_cudnn":
            shape = (1, cfg.num_kv_heads, max_len, cfg.head_dim)
            self.k_buf = [torch.empty(shape, dtype=torch.bfloat16, device=dev)
                          for _ in range(cfg.num_layers)]
            self.v_buf = [torch.empty_like(t) for t in self.k_buf]
            self.gqa = _cudnn_gqa_ok(dev)
        if kind == "bf16_flashinfer":
            import flashinfer
            self.ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
            self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.ws, "NHD",
                                                                          backend="fa2")

    def begin_chunk(self, start: int, n: int) -> None:
        """Page table for ``start + n`` tokens; the chunk's cache slots."""
        import torch
        t, cfg = self.table, self.cfg
        t.set_lengths([start + n])
        pos = torch.arange(start, start + n)
        pages = t.seq_pages[0, pos // t.page_size]
        self.slots = (pages * t.page_size + pos % t.page_size).to(self.dev)
        self.qo = torch.tensor([0, n], dtype=torch.int32, device=self.dev)
        self.start, self.n = start, n
        if self.kind == "int2":                    # one plan per chunk, for every layer
            self.plan = self.e2e.ops.plan_extend(self.qo, self.attn.caches[0], t.kv_indptr,
                                                 t.kv_last_page_len, t.window_slots)
        if self.kind == "bf16_flashinfer":
            m = t.num_used_pages
            self.prefill.plan(self.qo, t.kv_indptr, t.kv_indices[:m], t.kv_last_page_len,
                              cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, t.page_size,
                              causal=True, q_data_type=torch.bfloat16,
                              kv_data_type=torch.bfloat16)

    def attend(self, layer: int, q, k, v):
        """Write the chunk's K/V and attend with its queries: ``o [n, Hq, D]``."""
        import torch
        cfg, t = self.cfg, self.table
        if self.kind == "int2":
            m = t.num_used_pages
            return self.e2e.ops.paged_extend_attention(
                q, k, v, self.qo, self.attn.caches[layer], t.kv_indptr, t.kv_indices[:m],
                t.kv_last_page_len, t.window_slots, self.attn.rotations[layer],
                backend="auto", check_bounds=False, plan=self.plan)
        kp, vp = self.attn.k_pools[layer], self.attn.v_pools[layer]
        kp.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, self.slots, k)
        vp.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, self.slots, v)
        if self.kind == "bf16_flashinfer":
            return self.prefill.run(q, (kp, vp))
        s, n = self.start, self.n
        kb, vb = self.k_buf[layer], self.v_buf[layer]
        kb[0, :, s:s + n] = k.transpose(0, 1)
        vb[0, :, s:s + n] = v.transpose(0, 1)
        g = cfg.num_qo_heads // cfg.num_kv_heads
        qh = q.transpose(0, 1)[None]                                       # [1, Hq, n, D]
        op = torch.ops.aten._scaled_dot_product_cudnn_attention
        scale = cfg.head_dim ** -0.5

        def heads(x):
            return x if self.gqa else x.repeat_interleave(g, 1)
        o_c, lse_c = op(qh, heads(kb[:, :, s:s + n]), heads(vb[:, :, s:s + n]), None, True, 0.0,
                        True, False, scale=scale)[:2]
        if s == 0:
            return o_c[0].transpose(0, 1)
        o_p, lse_p = op(qh, heads(kb[:, :, :s]), heads(vb[:, :, :s]), None, True, 0.0, False,
                        False, scale=scale)[:2]
        lse_c, lse_p = lse_c.reshape(o_c.shape[:3]).float(), lse_p.reshape(o_p.shape[:3]).float()
        lse = torch.logaddexp(lse_c, lse_p)
        o = (o_c.float() * torch.exp(lse_c - lse)[..., None]
             + o_p.float() * torch.exp(lse_p - lse)[..., None])
        return o[0].transpose(0, 1).to(torch.bfloat16)


def prefill(stack, w, cfg, tokens, chunk: int, e2e):
    """Every chunk through every layer; the last token's logits."""
    import torch
    import torch.nn.functional as F
    eps = cfg.rms_eps
    logits = None
    for start in range(0, tokens.numel(), chunk):
        n = min(chunk, tokens.numel() - start)
        stack.begin_chunk(start, n)
        pos = torch.arange(start, start + n, dtype=torch.int32, device=tokens.device)
        x = F.embedding(tokens[start:start + n], w.embed)
        hs = torch.empty_like(x)
        e2e.add_rmsnorm_triton(x, None, w.layers[0]["ln1"], hs, eps)
        for i, lw in enumerate(w.layers):
            q, k, v = e2e.qkv_norm_rope_triton(F.linear(hs, lw["wqkv"]), pos, lw["q_norm"],
                                               lw["k_norm"], cfg)
            o = stack.attend(i, q, k, v)
            e2e.add_rmsnorm_triton(x, F.linear(o.reshape(n, cfg.q_dim), lw["wo"]), lw["ln2"],
                                   hs, eps)
            act = e2e.silu_mul_triton(F.linear(hs, lw["wgu"]))
            nxt = w.layers[i + 1]["ln1"] if i + 1 < len(w.layers) else w.norm
            e2e.add_rmsnorm_triton(x, F.linear(act, lw["wdown"]), nxt, hs, eps)
        logits = F.linear(hs[-1:], w.lm_head)
    return logits


def run_request(kind: str, prompt: int, args, cfg, w, e2e, hz) -> dict:
    import torch
    dev = torch.device("cuda")
    max_len = prompt + args.decode_steps + 16
    stack = Stack(kind, cfg, max_len, dev, e2e, seed=args.seed)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    tokens = torch.randint(0, cfg.vocab_size, (prompt,), device=dev, generator=g)
    prefill(stack, w, cfg, tokens[:min(prompt, args.chunk)], args.chunk, e2e)   # warm-up
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    t0 = time.perf_counter()
    ev[0].record()
    logits = prefill(stack, w, cfg, tokens, args.chunk, e2e)
    ev[1].record()
    torch.cuda.synchronize()
    ttft = ev[0].elapsed_time(ev[1])
    wall = (time.perf_counter() - t0) * 1e3
    finite = bool(torch.isfinite(logits).all())
    # decode: the step of bench_e2e at the midpoint context, CUDA graph
    ctx = prompt + args.decode_steps // 2
    model = e2e.DecodeModel(cfg, w, stack.attn, stack.table, fused=True)
    model.set_lengths([ctx])
    model.tokens.copy_(logits.argmax(-1))
    model.step()
    torch.cuda.synchronize()
    t = hz.time_cuda(model.step, warmup=3, rep=args.rep, graph=True, cold_l2=True)
    step = t["median_ms"]
    decode = step * args.decode_steps
    row = dict(stack=kind, prompt=prompt, chunk=args.chunk, decode_steps=args.decode_steps,
               ttft_ms=ttft, prefill_wall_ms=wall, step_ms=step, step_timing_mode=t["mode"],
               decode_tok_s=1e3 / step, decode_ms=decode, total_ms=ttft + decode,
               logits_finite=finite)
    if kind == "bf16_cudnn":
        row["cudnn_gqa"] = stack.gqa
    del model, stack
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fi-site", default=None, help="unpacked FlashInfer baseline (setup_site.py)")
    ap.add_argument("--prompts", default="32768,131072")
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--decode-steps", type=int, default=1000)
    ap.add_argument("--stacks", default="int2,bf16_cudnn,bf16_flashinfer")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.fi_site:
        sys.path.insert(0, a.fi_site)
        os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    import torch

    import bench_e2e as e2e
    from perf import harness as hz
    cfg = e2e.PRESETS["qwen3-8b"]
    head = hz.env_header()
    print(head, flush=True)
    w = e2e.DecodeWeights(cfg, torch.device("cuda"), seed=a.seed)
    rows = []
    for prompt in (int(x) for x in a.prompts.split(",")):
        for kind in a.stacks.split(","):
            try:
                row = run_request(kind, prompt, a, cfg, w, e2e, hz)
            except Exception as e:  # noqa: BLE001 - a stack that fails is reported
                row = dict(stack=kind, prompt=prompt, error=f"{type(e).__name__}: {e}"[:300])
                torch.cuda.empty_cache()
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()},
                  flush=True)
    for r in rows:
        base = [b for b in rows if b["prompt"] == r["prompt"] and b["stack"] != "int2"
                and "total_ms" in b]
        if r["stack"] == "int2" and "total_ms" in r and base:
            best_ttft = min(b["ttft_ms"] for b in base)
            best_total = min(b["total_ms"] for b in base)
            r["ttft_over_best_bf16"] = r["ttft_ms"] / best_ttft
            r["total_over_best_bf16"] = r["total_ms"] / best_total
    cols = [("stack", "stack", ""), ("prompt", "prompt", ""), ("chunk", "chunk", ""),
            ("ttft_ms", "TTFT ms", ".0f"), ("step_ms", "decode step ms", ".2f"),
            ("decode_tok_s", "decode tok/s", ".1f"), ("total_ms", "request ms", ".0f"),
            ("ttft_over_best_bf16", "TTFT / best BF16", ".3f"),
            ("total_over_best_bf16", "request / best BF16", ".3f")]
    table = hz.markdown_table(rows, cols)
    print(table, flush=True)
    if a.out:
        gpu = head.get("gpu", "gpu").lower().replace("nvidia ", "").replace(" ", "-")
        stem = f"{_dt.date.today().isoformat()}_{gpu}_bench_request"
        hz.write_results(stem, head, {"rows": rows}, table, out_dir=a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
