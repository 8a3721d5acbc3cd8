"""Tensor-parallel check of the INT2 cache: KV heads split across ranks (issue 7).

One process per GPU (``torch.distributed``, NCCL, ``NCCL_NVLS_ENABLE=0``), or with
``--simulate`` one process per simulated rank on the CPU (gloo, reference backend, small
lengths). For each model shape (Qwen3-8B: 32 query / 8 KV heads; Llama-3-70B: 64 / 8;
head_dim 128) every rank:

1. builds the same full inputs from one seed (queries, K/V, per-head rotations, a shuffled
   page table), keeps its KV heads ``[h0, h1)`` (``oscar_kernels.integrations.tp``) and their
   query heads, and slices the per-head rotations to them;
2. runs **extend** (chunked prefill of ``len - 1`` tokens per sequence:
   ``ops.paged_extend_attention``), **write** (the last token:
   ``ops.quantize_append_paged_kv_cache``) and **decode** (``ops.paged_decode_attention``)
   on its own :class:`Int2PagedKVCache`;
3. all-gathers the outputs; rank 0 concatenates them by head range and compares with the
   single-device run over all heads (same backend), reporting the max abs difference and
   whether it is bit-identical;
4. (GPU, unless ``--no-time``) times its decode at ``--time-ctx`` tokens (64K) per sequence
   with the harness (CUDA-graph replay, cold L2); rank 0 reports every rank's median.

Usage::

    torchrun --nproc-per-node 8 perf/tp_check.py            # or: python perf/tp_check.py --world-size 8
    python perf/tp_check.py --simulate --world-size 2       # CPU, gloo, reference backend

Results (``--out DIR``, default ``perf/results`` on GPU): ``tp_check_<tag>.json`` / ``.md``
with the environment header of perf/harness.py.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation, ops  # noqa: E402
from oscar_kernels.integrations.tp import kv_head_range, shard_rotation  # noqa: E402

MODELS = {
    "qwen3-8b": {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128},
    "llama3-70b": {"num_qo_heads": 64, "num_kv_heads": 8, "head_dim": 128},
}


def _orthogonal(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, d, d, generator=gen, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]).to(torch.float32)


def make_inputs(model: dict, lens: list[int], page_size: int, seed: int) -> dict:
    """The full problem (all heads), identical on every rank (CPU, fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    h, hq, d = model["num_kv_heads"], model["num_qo_heads"], model["head_dim"]
    nnz = sum(lens)
    pages = [-(-n // page_size) for n in lens]
    perm = torch.randperm(sum(pages) + 2, generator=gen).to(torch.int32)
    bf = torch.bfloat16
    return {
        "k": torch.randn(nnz, h, d, generator=gen).to(bf),
        "v": torch.randn(nnz, h, d, generator=gen).to(bf),
        "q_ext": torch.randn(nnz - len(lens), hq, d, generator=gen).to(bf),
        "q_dec": torch.randn(len(lens), hq, d, generator=gen).to(bf),
        "rot": LayerRotation(_orthogonal(h, d, gen), _orthogonal(h, d, gen), 0.96, 0.92),
        "pages": pages, "perm": perm, "num_pages": sum(pages) + 2,
    }


def _i32(x, dev):
    return torch.tensor(x, dtype=torch.int32, device=dev)


def run_heads(inp: dict, model: dict, lens: list[int], heads: tuple[int, int], *,
              spec_kw: dict, backend: str, device: torch.device) -> dict:
    """Extend + write + decode over KV heads ``[h0, h1)`` and their query heads."""
    h0, h1 = heads
    h, hq = model["num_kv_heads"], model["num_qo_heads"]
    g = hq // h
    spec = CacheSpec(num_kv_heads=h1 - h0, head_dim=model["head_dim"], **spec_kw)
    cache = Int2PagedKVCache.allocate(spec, inp["num_pages"], len(lens), device=device)
    rot = shard_rotation(inp["rot"], h0, h1, h).to(device)
    ps = spec.page_size
    ip_full = [0]
    for p in inp["pages"]:
        ip_full.append(ip_full[-1] + p)
    ix = inp["perm"][: ip_full[-1]].to(device)
    slots = _i32(list(range(len(lens))), device)
    # extend: the first len - 1 tokens of every sequence in one chunk
    pre = [n - 1 for n in lens]
    pre_pages = [-(-n // ps) for n in pre]
    ix_pre = torch.cat([ix[ip_full[b]: ip_full[b] + pre_pages[b]] for b in range(len(lens))])
    ip_pre = [0]
    for p in pre_pages:
        ip_pre.append(ip_pre[-1] + p)
    last_pre = [(n - 1) % ps + 1 if n else 0 for n in pre]
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    take = torch.cat([torch.arange(starts[b], starts[b] + pre[b]) for b in range(len(lens))])
    last_tok = torch.tensor([starts[b] + lens[b] - 1 for b in range(len(lens))])
    k = inp["k"][:, h0:h1].to(device)
    v = inp["v"][:, h0:h1].to(device)
    qo = [0]
    for n in pre:
        qo.append(qo[-1] + n)
    o_ext = ops.paged_extend_attention(
        inp["q_ext"][:, h0 * g:h1 * g].to(device), k[take], v[take], _i32(qo, device), cache,
        _i32(ip_pre, device), ix_pre, _i32(last_pre, device), slots, rot, backend=backend)
    # write: the last token of each sequence
    ip = _i32(ip_full, device)
    last = _i32([(n - 1) % ps + 1 for n in lens], device)
    ops.quantize_append_paged_kv_cache(k[last_tok], v[last_tok],
                                       _i32(list(range(len(lens))), device),
                                       _i32([n - 1 for n in lens], device), cache, ix, ip, last,
                                       slots, rot, backend=backend)
    # decode
    o_dec = ops.paged_decode_attention(inp["q_dec"][:, h0 * g:h1 * g].to(device), cache, ip, ix,
                                       last, slots, rot, backend=backend)
    return {"o_ext": o_ext, "o_dec": o_dec}


def time_decode(model: dict, heads: tuple[int, int], *, batch: int, ctx: int, spec_kw: dict,
                backend: str, device: torch.device) -> dict:
    """Median decode time of this rank's heads at ``ctx`` tokens per sequence (random bytes
    in the pages and windows: the timing does not depend on their values)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from harness import time_cuda  # noqa: PLC0415

    h0, h1 = heads
    g = model["num_qo_heads"] // model["num_kv_heads"]
    spec = CacheSpec(num_kv_heads=h1 - h0, head_dim=model["head_dim"], **spec_kw)
    ps = spec.page_size
    per = -(-ctx // ps)
    cache = Int2PagedKVCache.allocate(spec, per * batch + 1, batch, device=device)
    for name, t in cache.tensors().items():
        if t.dtype == torch.uint8:
            t.random_(0, 256)
        else:
            t.copy_(torch.rand(t.shape, device=device) * 0.1)
    ip = _i32([b * per for b in range(batch + 1)], device)
    ix = torch.randperm(per * batch + 1, device=device)[: per * batch].to(torch.int32)
    last = _i32([(ctx - 1) % ps + 1] * batch, device)
    slots = _i32(list(range(batch)), device)
    rot = LayerRotation.hadamard(model["head_dim"], device=device)
    q = torch.randn(batch, (h1 - h0) * g, model["head_dim"], device=device, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    ops.paged_decode_attention(q, cache, ip, ix, last, slots, rot, backend=backend, out=out)

    def fn():
        ops.paged_decode_attention(q, cache, ip, ix, last, slots, rot, backend=backend, out=out,
                                   check_bounds=False)

    t = time_cuda(fn)
    kv_bytes = batch * spec.bytes_per_sequence(ctx)
    return {"median_ms": t["median_ms"], "mode": t.get("mode"), "kv_bytes": kv_bytes,
            "tb_per_s": kv_bytes / (t["median_ms"] * 1e-3) / 1e12}


def _gather(x: torch.Tensor, world: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return parts


def worker(rank: int, world: int, args, port: int | None = None) -> dict | None:
    simulate = args.simulate
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if simulate:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    backend = args.backend if not simulate else "reference"
    spec_kw = {"page_size": args.page_size, "sink_size": args.sink_size,
               "recent_size": args.recent_size}
    lens = [int(x) for x in args.lens.split(",")]
    report = {"world_size": world, "simulate": simulate, "backend": backend, "lens": lens,
              "spec": spec_kw, "models": []}
    for name in args.models.split(","):
        model = MODELS[name]
        heads = kv_head_range(rank, world, model["num_kv_heads"])
        inp = make_inputs(model, lens, args.page_size, args.seed)
        t0 = time.perf_counter()
        mine = run_heads(inp, model, lens, heads, spec_kw=spec_kw, backend=backend,
                         device=device)
        gathered = {k: _gather(v, world) for k, v in mine.items()}
        ranges = [kv_head_range(r, world, model["num_kv_heads"]) for r in range(world)]
        row = {"model": name, "kv_heads_per_rank": heads[1] - heads[0],
               "check_s": round(time.perf_counter() - t0, 2)}
        if rank == 0:
            full = run_heads(inp, model, lens, (0, model["num_kv_heads"]), spec_kw=spec_kw,
                             backend=backend, device=device)
            g = model["num_qo_heads"] // model["num_kv_heads"]
            for key in ("o_ext", "o_dec"):
                seen, parts = set(), []
                for r, (h0, h1) in enumerate(ranges):
                    if (h0, h1) in seen:  # replicated heads (tp > kv heads): ranks must agree
                        first = ranges.index((h0, h1))
                        row.setdefault("replicas_identical", True)
                        row["replicas_identical"] &= bool(torch.equal(gathered[key][r],
                                                                      gathered[key][first]))
                        continue
                    seen.add((h0, h1))
                    parts.append(gathered[key][r])
                cat = torch.cat(parts, dim=1)
                diff = (cat.float() - full[key].float()).abs().max().item()
                row[f"{key}_max_abs_diff"] = diff
                row[f"{key}_bit_identical"] = bool(torch.equal(cat, full[key]))
                assert cat.shape == full[key].shape and cat.shape[1] == g * model["num_kv_heads"]
        if not simulate and not args.no_time:
            t = time_decode(model, heads, batch=args.time_batch, ctx=args.time_ctx,
                            spec_kw=spec_kw, backend=backend, device=device)
            allt = [None] * world
            dist.all_gather_object(allt, t)
            row["decode_time_per_rank"] = allt
        report["models"].append(row)
    dist.barrier()
    dist.destroy_process_group()
    return report if rank == 0 else None


def _spawned(rank, world, args, port, queue):
    rep = worker(rank, world, args, port)
    if rank == 0:
        queue.put(rep)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks to spawn (default: all GPUs; 2 with --simulate); ignored under "
                        "torchrun")
    p.add_argument("--simulate", action="store_true",
                   help="ranks as CPU processes with gloo and the reference backend")
    p.add_argument("--models", default="qwen3-8b,llama3-70b")
    p.add_argument("--lens", default=None,
                   help="comma-separated check lengths (default 2000,333,4097 on GPU; "
                        "130,37 simulated)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--sink-size", type=int, default=None)
    p.add_argument("--recent-size", type=int, default=None)
    p.add_argument("--backend", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--time-ctx", type=int, default=65536)
    p.add_argument("--time-batch", type=int, default=8)
    p.add_argument("--out", default=None, help="results directory (GPU default perf/results)")
    args = p.parse_args(argv)
    if args.lens is None:
        args.lens = "130,37" if args.simulate else "2000,333,4097"
    if args.sink_size is None:
        args.sink_size = 8 if args.simulate else 64
    if args.recent_size is None:
        args.recent_size = 32 if args.simulate else 256
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        rep = worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        world = args.world_size or (2 if args.simulate else torch.cuda.device_count())
        if world < 1 or (not args.simulate and world > torch.cuda.device_count()):
            raise SystemExit(f"--world-size {world}: this machine has "
                             f"{torch.cuda.device_count()} GPUs (use --simulate on a CPU)")
        ctx = torch.multiprocessing.get_context("spawn")
        queue = ctx.SimpleQueue()
        torch.multiprocessing.start_processes(_spawned, args=(world, args, _free_port(), queue),
                                              nprocs=world, start_method="spawn")
        rep = queue.get()
    if rep is not None:
        _print_and_save(rep, args)
    return rep


def _print_and_save(rep: dict, args) -> None:
    lines = [f"world_size={rep['world_size']} simulate={rep['simulate']} "
             f"backend={rep['backend']} lens={rep['lens']} spec={rep['spec']}"]
    for row in rep["models"]:
        lines.append(f"{row['model']}: kv_heads/rank={row['kv_heads_per_rank']} "
                     f"extend max|diff|={row['o_ext_max_abs_diff']:.3g} "
                     f"(bit-identical {row['o_ext_bit_identical']}), "
                     f"decode max|diff|={row['o_dec_max_abs_diff']:.3g} "
                     f"(bit-identical {row['o_dec_bit_identical']})")
        for r, t in enumerate(row.get("decode_time_per_rank") or []):
            lines.append(f"  rank {r}: decode {t['median_ms']:.4f} ms at "
                         f"{args.time_ctx} tokens x {args.time_batch} ({t['tb_per_s']:.2f} TB/s, "
                         f"{t['mode']})")
    text = "\n".join(lines)
    print(text)
    out = args.out or (None if rep["simulate"] else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results"))
    if out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from harness import env_header, write_results  # noqa: PLC0415

        tag = ("simulated" if rep["simulate"] else "gpu") + f"_tp{rep['world_size']}"
        write_results(f"tp_check_{tag}", env_header(), rep, "```\n" + text + "\n```", out)


if __name__ == "__main__":
    main()
