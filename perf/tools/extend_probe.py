"""Launch configurations of the Triton extend (chunked prefill) kernel, checked and timed.

    PYTHONPATH=. python3 perf/tools/extend_probe.py --configs one:16,64,4,1 part:128,64,8,2 --fi-site /tmp/fi_site

Each config ``one:BLOCK_M,BLOCK_N,WARPS,STAGES[,UNPACK]`` (one kernel for every key: the
``EXTEND_*`` constants of :mod:`oscar_kernels.triton.paged_extend`; ``UNPACK`` as in
``_blocks``: 2 the subnormal PTX, 0 element-wise) or ``part:BLOCK_M,BLOCK_N,WARPS,STAGES``
(the INT2 pages first in ``_extend_int2_kernel``: its ``EXTEND_INT2_*`` constants) or
``part:BLOCK_M,BLOCK_N,WARPS,STAGES,UNPACK,MAIN_BLOCK_M,MAIN_BLOCK_N,MAIN_WARPS,MAIN_STAGES,WHOLE``
(also the INT2 kernel's unpack and whole-row dots, and the main kernel's ``EXTEND_PART_*``
launch, which then attends only the BF16 rows with the query the INT2 kernel took) is set in a process of its
own, then

* checked: the three shapes of ``tests/triton/test_triton_gpu.py::test_extend_gpu``
  (GQA 4 / 8 / 1, head_dim 128 / 64, groups of 128 / 16 / 64, NHD / HND, page 16 / 64)
  against the reference op on the GPU, with that test's bounds (relative error < 1e-2,
  lse within 2e-2); a config that fails is reported and not timed;
* timed: Qwen3-8B geometry (32 / 8 heads, head_dim 128, page 16, HND, group 128),
  ``--batch`` sequences each appending ``--chunk`` tokens onto ``--prefix`` cached ones,
  eager calls (the launcher reads the chunk lengths on the host), CUDA events, cold L2,
  median; attention FLOPs counted causally (query at position t sees t + 1 keys; 4 flops
  per (query head, key, channel)).

With ``--fi-site`` (an unpacked ../shared/baselines/flashinfer, ``setup_site.py``) FlashInfer
0.7.2's BF16 paged prefill on the same shape (``BatchPrefillWithPagedKVCacheWrapper``,
causal, HND, page 16) is timed the same way (CUDA-graph replay: its plan is on the host).
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def causal_flops(prefix: int, chunk: int, batch: int, hq: int, d: int) -> float:
    keys = sum(prefix + i + 1 for i in range(chunk))
    return 4.0 * batch * keys * hq * d


def check(config_label: str) -> tuple[bool, str]:
    """The GPU test's extend shapes against the reference; (ok, worst errors)."""
    import torch

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "triton"))
    from helpers import rel_err
    from oscar_kernels import CacheSpec, ops
    from triton_cases import build_case, offsets

    cases = [(128, 8, 4, 16, None, "NHD", [4099, 300, 1000], [512, 300, 77]),
             (64, 2, 8, 64, 16, "HND", [700, 65], [600, 1]),
             (128, 4, 1, 16, 64, "NHD", [2000], [300])]
    worst_o, worst_l, ok = 0.0, 0.0, True
    for d, h, gqa, ps, g, layout, lens, chunks in cases:
        spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=ps, group_size=g,
                         kv_layout=layout)
        prefix = [n - c for n, c in zip(lens, chunks)]
        res = {}
        for backend in ("triton", "reference"):
            case = build_case(spec, lens, h * gqa, torch.Generator().manual_seed(9),
                              device="cuda", prefix_lens=prefix)
            sel = torch.cat([torch.arange(o + p, o + n) for o, p, n in
                             zip(offsets(lens), prefix, lens)]).cuda()
            qo = torch.tensor([0] + torch.tensor(chunks).cumsum(0).tolist(),
                              dtype=torch.int32, device="cuda")
            q = torch.randn(len(sel), h * gqa, d, generator=torch.Generator().manual_seed(4))
            q = q.to(torch.bfloat16).cuda()
            q = q if backend == "triton" else q.float()
            out = torch.full_like(q, float("nan"))
            o, lse = ops.paged_extend_attention(
                q, case["k"][sel], case["v"][sel], qo, case["cache"], case["kv_indptr"],
                case["kv_indices"], case["kv_last_page_len"], case["window_slots"],
                case["rot"], out=out, return_lse=True, backend=backend)
            torch.cuda.synchronize()
            res[backend] = (o, lse)
        (o_t, l_t), (o_r, l_r) = res["triton"], res["reference"]
        if bool(o_t.isnan().any()):
            return False, "NaN in the output (unwritten rows)"
        eo, el = rel_err(o_t, o_r), float((l_t - l_r).abs().max())
        worst_o, worst_l = max(worst_o, eo), max(worst_l, el)
        ok = ok and eo < 1e-2 and el < 2e-2
    return ok, f"rel err {worst_o:.2e}, lse {worst_l:.2e}"


def timed_case(batch: int, prefix: int, chunk: int):
    """The Qwen3-8B-shaped INT2 extend call of perf/bench_prefill.py."""
    from perf.bench_prefill import int2_call
    return int2_call(batch, prefix, chunk)


def flashinfer_call(batch: int, prefix: int, chunk: int):
    """FlashInfer's BF16 paged prefill on the same shape (perf/bench_prefill.py)."""
    from perf.bench_prefill import flashinfer_call as call
    return call(batch, prefix, chunk)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["one:16,64,4,1"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prefix", type=int, nargs="+", default=[28672])
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--rep", type=int, default=10)
    ap.add_argument("--fi-site", default=None)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--inline", action="store_true", help="all configs in this process")
    ap.add_argument("--profile", action="store_true",
                    help="also each kernel's device time per call (torch profiler)")
    a = ap.parse_args(argv)
    if a.fi_site:
        sys.path.insert(0, a.fi_site)
        os.environ.setdefault("FLASHINFER_DISABLE_JIT", "1")
    import torch

    from oscar_kernels.triton import paged_extend as pe
    from perf.harness import env_header, profile_kernels, time_cuda

    if not a.inline:
        print(env_header(), flush=True)
    for prefix in (a.prefix if not a.inline else []):
        fl = causal_flops(prefix, a.chunk, a.batch, 32, 128)
        print(f"# batch {a.batch} prefix {prefix} chunk {a.chunk}: {fl / 1e12:.3f} TFLOP "
              "(causal, QK + PV)", flush=True)
        if a.fi_site:
            try:
                fn, keep = flashinfer_call(a.batch, prefix, a.chunk)
                t = time_cuda(fn, warmup=2, rep=a.rep)["median_ms"]
                print(f"flashinfer bf16 prefill: {t:.3f} ms, {fl / t / 1e9:.0f} TFLOP/s",
                      flush=True)
                del keep
            except Exception as e:  # noqa: BLE001 (report and go on)
                print(f"flashinfer bf16 prefill: failed ({type(e).__name__}: {e})", flush=True)
    if len(a.configs) > 1 and not a.inline:
        # one process per config: an illegal access poisons the CUDA context
        import subprocess
        for cfg in a.configs:
            args = [sys.executable, os.path.abspath(__file__), "--inline", "--configs", cfg,
                    "--batch", str(a.batch), "--chunk", str(a.chunk), "--rep", str(a.rep),
                    "--prefix", *map(str, a.prefix)] + (["--no-check"] if a.no_check else [])
            args += ["--profile"] if a.profile else []
            r = subprocess.run(args, capture_output=True, text=True)
            lines = [ln for ln in (r.stdout + r.stderr).splitlines()
                     if ln.startswith("BLOCK_M") or "Error" in ln]
            print("\n".join(lines if a.profile else lines[-6:]) or f"{cfg}: no output (rc {r.returncode})", flush=True)
        return 0
    for cfg in a.configs:
        kind, _, nums = cfg.rpartition(":")
        vals = [int(x) for x in nums.split(",")]
        bm, bn, w, st = vals[:4]
        if kind == "part":      # the INT2 pages in _extend_int2_kernel, then the main kernel
            pe.EXTEND_INT2_MIN_PROGRAMS_PER_SM = 0
            (pe.EXTEND_INT2_BLOCK_M, pe.EXTEND_INT2_BLOCK_N, pe.EXTEND_INT2_WARPS,
             pe.EXTEND_INT2_STAGES) = bm, bn, w, st
            if len(vals) > 4:
                pe.EXTEND_INT2_UNPACK = vals[4]
            if len(vals) > 5:
                (pe.EXTEND_PART_BLOCK_M, pe.EXTEND_PART_BLOCK_N, pe.EXTEND_PART_WARPS,
                 pe.EXTEND_PART_STAGES) = vals[5:9]
            if len(vals) > 9:
                pe.EXTEND_INT2_WHOLE = bool(vals[9])
            label = (f"BLOCK_M {bm} BLOCK_N {bn} warps {w} stages {st} unpack "
                     f"{pe.EXTEND_INT2_UNPACK} (INT2 part kernel); main kernel BLOCK_M "
                     f"{pe.EXTEND_PART_BLOCK_M} BLOCK_N {pe.EXTEND_PART_BLOCK_N} warps "
                     f"{pe.EXTEND_PART_WARPS} stages {pe.EXTEND_PART_STAGES}; whole-row dots "
                     f"{int(pe.EXTEND_INT2_WHOLE)}")
        else:                   # one kernel for everything (the main kernel's config)
            pe.EXTEND_INT2_MIN_PROGRAMS_PER_SM = 10 ** 9
            unpack = vals[4] if len(vals) > 4 else 2
            (pe.EXTEND_BLOCK_M, pe.EXTEND_BLOCK_N, pe.EXTEND_WARPS,
             pe.EXTEND_STAGES) = bm, bn, w, st
            pe.EXTEND_UNPACK = unpack
            label = f"BLOCK_M {bm} BLOCK_N {bn} warps {w} stages {st} unpack {unpack}"
        try:
            if not a.no_check:
                ok, msg = check(label)
                print(f"{label}: check {'ok' if ok else 'FAILED'} ({msg})", flush=True)
                if not ok:
                    continue
            for prefix in a.prefix:
                fl = causal_flops(prefix, a.chunk, a.batch, 32, 128)
                fn = timed_case(a.batch, prefix, a.chunk)
                t = time_cuda(fn, warmup=2, rep=a.rep, graph=False)["median_ms"]
                print(f"{label}: prefix {prefix} chunk {a.chunk}: {t:.3f} ms, "
                      f"{fl / t / 1e9:.0f} TFLOP/s", flush=True)
                if a.profile:
                    for name, (n, us) in sorted(profile_kernels(fn, iters=3).items(),
                                                key=lambda kv: -kv[1][1]):
                        print(f"BLOCK_M {bm} profile, prefix {prefix}: {us / 1e3:8.3f} ms "
                              f"x{n:g} {name}", flush=True)
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            print(f"{label}: error {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
