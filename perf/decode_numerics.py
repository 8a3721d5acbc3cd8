"""Decode numerics: every decode backend against an fp64 oracle on the same cache bytes.

    PYTHONPATH=. python3 perf/decode_numerics.py --fi-site /tmp/fi_site --out perf/results

Per case, one INT2 cache (random codes and scale/zero, random BF16 window rows, random
orthogonal rotations per KV head) and one bf16 query per sequence. The oracle dequantizes
the cache (``zero + scale * code``), applies the read rule (docs/format.md), rotates the
query, attends and un-rotates, all in float64. Rows:

* ``cute``: ``ops.paged_decode_attention(backend="cute")`` (the planned split count);
* ``cute_1split``: the CuTe kernel with one split (no split merge);
* ``triton``: ``backend="triton"``;
* ``bf16_torch``: plain bf16 torch attention on the same rotated values (bf16 query,
  keys, values and probabilities; fp32 accumulation), un-rotated in fp32;
* ``flashinfer_bf16``: FlashInfer 0.7.2's BF16 decode (tensor cores) on the BF16 rounding
  of the same rotated keys / values and query, un-rotated in fp32 (with ``--fi-site``).

Error per element: ``|o - ref| / (|ref| + 0.5)``; the table gives its maximum over the
case and the relative L2 error ``||o - ref|| / ||ref||``. ``--q-scale`` multiplies the
query (a larger scale gives peakier attention, as in trained models).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PRESETS = {"qwen3-8b": (32, 8, 128), "llama3-70b-tp8": (8, 1, 128)}
# (preset, batch, context or "mixed:<max>", q_scale)
CASES = [("qwen3-8b", 4, 8192, 1.0), ("qwen3-8b", 4, 8192, 12.0),
         ("qwen3-8b", 4, 65536, 12.0), ("llama3-70b-tp8", 1, 131072, 12.0),
         ("llama3-70b-tp8", 8, 8192, 12.0), ("qwen3-8b", 256, "mixed:8192", 12.0)]


def make_case(preset: str, batch: int, ctx, q_scale: float, seed: int = 0):
    import torch

    from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation

    hq, h, d = PRESETS[preset]
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    if isinstance(ctx, str):
        hi = int(ctx.split(":")[1])
        lens = torch.randint(1, hi + 1, (batch,), device=dev, generator=g).tolist()
    else:
        lens = [ctx] * batch
    spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=16, kv_layout="HND")
    pages = [-(-n // 16) for n in lens]
    num_pages = sum(pages)
    cache = Int2PagedKVCache.allocate(spec, num_pages, batch, device=dev)
    for codes in (cache.k_codes, cache.v_codes):
        codes.view(torch.int32).random_(generator=g)
    for params in (cache.k_params, cache.v_params):
        scale = torch.rand(params.shape[:-1], device=dev, generator=g) * 0.5 + 0.1
        params[..., 0] = scale.to(params.dtype)
        params[..., 1] = (-1.5 * scale + 0.2 * torch.randn(scale.shape, device=dev,
                                                           generator=g)).to(params.dtype)
    for w in (cache.k_window, cache.v_window):
        w.copy_(torch.randn(w.shape, device=dev, generator=g).to(torch.bfloat16))
    indices = torch.randperm(num_pages, device=dev, generator=g).to(torch.int32)
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32,
                          device=dev)
    last = torch.tensor([n - (p - 1) * 16 for n, p in zip(lens, pages)], dtype=torch.int32,
                        device=dev)
    slots = torch.randperm(batch, device=dev, generator=g).to(torch.int32)
    rots = [torch.linalg.qr(torch.randn(h, d, d, device=dev, generator=g,
                                        dtype=torch.float64))[0].float() for _ in range(2)]
    rot = LayerRotation(rots[0], rots[1], 0.95, 0.95)
    q = (torch.randn(batch, hq, d, device=dev, generator=g) * q_scale).to(torch.bfloat16)
    return dict(spec=spec, cache=cache, table=(indptr, indices, last, slots), rot=rot, q=q,
                lens=lens)


def rotated_values(case, b: int):
    """The rotated keys / values sequence ``b``'s decode query reads (fp32, read rule)."""
    import torch

    from oscar_kernels.reference.paged import _sequence_kv

    spec, cache = case["spec"], case["cache"]
    indptr, indices, _, slots = case["table"]
    n = case["lens"][b]
    k_int2, v_int2, k_full, v_full = _sequence_kv(cache, b, n, indices, indptr, slots)
    pos = torch.arange(n, device=k_int2.device)
    full = ((pos < spec.sink_size) | (pos >= n - spec.recent_size))[:, None, None]
    return torch.where(full, k_full, k_int2), torch.where(full, v_full, v_int2)


def oracle_and_bf16(case, scale: float):
    """fp64 oracle and the plain bf16 torch attention, ``[batch, Hq, D]`` each."""
    import torch

    q, rot = case["q"], case["rot"]
    hq, d = q.shape[1:]
    h = case["spec"].num_kv_heads
    g = hq // h
    rk, rv = (r.double() for r in rot.per_head(h))
    ref = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    bf = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        kk, vv = rotated_values(case, b)
        qr = torch.einsum("hgd,hde->hge", q[b].double().reshape(h, g, d), rk)
        s = torch.einsum("hgd,lhd->hgl", qr, kk.double()) * scale
        o = torch.einsum("hgl,lhd->hgd", torch.softmax(s, -1), vv.double())
        ref[b] = torch.einsum("hgd,hed->hge", o, rv).reshape(hq, d)
        qb = qr.to(torch.bfloat16)
        s = torch.einsum("hgd,lhd->hgl", qb.float(), kk.to(torch.bfloat16).float()) * scale
        p = torch.softmax(s, -1).to(torch.bfloat16)
        o = torch.einsum("hgl,lhd->hgd", p.float(), vv.to(torch.bfloat16).float())
        o = o.to(torch.bfloat16).float()
        bf[b] = torch.einsum("hgd,hed->hge", o, rv.float()).reshape(hq, d)
    return ref, bf


def flashinfer_bf16(case, scale: float):
    """FlashInfer's BF16 decode on the BF16 rotated values, un-rotated in fp32."""
    import flashinfer
    import torch

    q, rot, spec = case["q"], case["rot"], case["spec"]
    batch, hq, d = q.shape
    h = spec.num_kv_heads
    g = hq // h
    rk, rv = rot.per_head(h)
    pages = [-(-n // 16) for n in case["lens"]]
    kp = torch.zeros((sum(pages), 16, h, d), dtype=torch.bfloat16, device=q.device)
    vp = torch.zeros_like(kp)
    start = 0
    for b, n in enumerate(case["lens"]):
        kk, vv = rotated_values(case, b)
        kp.view(-1, h, d)[start * 16:start * 16 + n] = kk.to(torch.bfloat16)
        vp.view(-1, h, d)[start * 16:start * 16 + n] = vv.to(torch.bfloat16)
        start += pages[b]
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32,
                          device=q.device)
    indices = torch.arange(sum(pages), dtype=torch.int32, device=q.device)
    last = torch.tensor([n - (p - 1) * 16 for n, p in zip(case["lens"], pages)],
                        dtype=torch.int32, device=q.device)
    qr = torch.einsum("bhgd,hde->bhge", q.float().reshape(batch, h, g, d), rk.float())
    qr = qr.reshape(batch, hq, d).to(torch.bfloat16)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, h, d, 16, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16, sm_scale=scale)
    o = w.run(qr, (kp, vp)).float().reshape(batch, h, g, d)
    return torch.einsum("bhgd,hed->bhge", o, rv.float()).reshape(batch, hq, d)


def errors(o, ref) -> dict:
    o = o.double()
    return {"max_err": float(((o - ref).abs() / (ref.abs() + 0.5)).max()),
            "rel_l2": float((o - ref).norm() / ref.norm())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fi-site", default=None, help="unpacked FlashInfer baseline (setup_site.py)")
    ap.add_argument("--out", default=None, help="folder for the json / md results")
    a = ap.parse_args(argv)
    if a.fi_site:
        sys.path.insert(0, a.fi_site)
        os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    import torch

    from oscar_kernels import cute, ops
    from perf.harness import env_header, markdown_table, write_results

    head = env_header()
    print(head, flush=True)
    rows = []
    for preset, batch, ctx, q_scale in CASES:
        case = make_case(preset, batch, ctx, q_scale)
        q, cache, table, rot = case["q"], case["cache"], case["table"], case["rot"]
        d = q.shape[-1]
        scale = d ** -0.5
        ref, bf = oracle_and_bf16(case, scale)
        outs = {}
        for backend in ("cute", "triton"):
            out = torch.full_like(q, float("nan"))
            outs[backend] = ops.paged_decode_attention(q, cache, *table, rot, out=out,
                                                       backend=backend)
        out = torch.full_like(q, float("nan"))
        outs["cute_1split"] = cute.decode(q, cache, *table, *rot.per_head(cache.spec.num_kv_heads),
                                          scale, out=out, num_splits=1)[0]
        outs["bf16_torch"] = bf
        if a.fi_site:
            try:
                outs["flashinfer_bf16"] = flashinfer_bf16(case, scale)
            except Exception as e:  # noqa: BLE001 - a baseline that fails is reported
                print(f"flashinfer: {type(e).__name__}: {e}", flush=True)
        torch.cuda.synchronize()
        row = dict(preset=preset, batch=batch, context=ctx, q_scale=q_scale)
        for name, o in outs.items():
            e = errors(o, ref)
            row[f"{name}_max_err"] = e["max_err"]
            row[f"{name}_rel_l2"] = e["rel_l2"]
        if row.get("triton_max_err"):
            row["cute_over_triton"] = row["cute_max_err"] / row["triton_max_err"]
        rows.append(row)
        print(row, flush=True)
        del case, outs, ref, bf
        torch.cuda.empty_cache()
    names = ["cute", "cute_1split", "triton", "bf16_torch", "flashinfer_bf16"]
    cols = [("preset", "preset", ""), ("batch", "batch", ""), ("context", "context", ""),
            ("q_scale", "q scale", "")]
    cols += [(f"{n}_max_err", f"{n} max", ".2e") for n in names]
    cols += [("cute_over_triton", "CuTe / Triton (max)", ".2f")]
    cols += [(f"{n}_rel_l2", f"{n} L2", ".1e") for n in names]
    table = markdown_table(rows, cols)
    print(table, flush=True)
    if a.out:
        gpu = head.get("gpu", "gpu").lower().replace("nvidia ", "").replace(" ", "-")
        stem = f"{_dt.date.today().isoformat()}_{gpu}_decode_numerics"
        write_results(stem, head, {"rows": rows}, table, out_dir=a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
