"""CPU smoke test of perf/bench_e2e.py: the tiny preset, both attention stacks, eager steps."""

import importlib.util
import os
import sys

import pytest
import torch

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "perf", "bench_e2e.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_e2e", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_e2e"] = mod   # dataclasses look their module up while building
    spec.loader.exec_module(mod)
    return mod


def _stack(bench, kind, cfg, weights, batch, max_len, page_size=4, backend="reference"):
    spec = bench.int2_spec(cfg, page_size, None)
    pages = batch * -(-max_len // page_size) + 3
    if kind == "bf16":
        attn = bench.Bf16PagedAttention(cfg, page_size=page_size, num_pages=pages,
                                        device=torch.device("cpu"), kernel="sdpa")
    else:
        attn = bench.Int2PagedAttention(cfg, spec, num_pages=pages, num_window_slots=batch,
                                        device=torch.device("cpu"), backend=backend)
    attn.fill_random(11)
    table = bench.PageTable(batch, max_len, page_size, pages, torch.device("cpu"), seed=5)
    return bench.DecodeModel(cfg, weights, attn, table)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_two_steps_finite_and_int2_attention_matches_reference_op(bench, layout):
    """``--steps 2`` over a random prefix: finite logits for both stacks; the INT2 stack's
    last-layer attention equals the reference op on its own cache, the BF16 stack's an
    fp32 attention over its gathered pages (INT2 pages in either layout)."""
    res = bench.main(["--preset", "tiny", "--device", "cpu", "--steps", "2",
                      "--check-len", "29", "--int2-page-size", "4", "--bf16-page-size", "4",
                      "--int2-kv-layout", layout])
    steps = res["steps"]
    assert {(s["cache"], s["step"]) for s in steps} == {(c, i) for c in ("bf16", "int2")
                                                       for i in range(2)}
    for s in steps:
        assert s["logits_finite"], s
        # lengths grow by one per step, past sink + recent (4 + 8) so INT2 pages are read
        assert s["seq_lens"] == [29 + s["step"] + 1, 14 + s["step"] + 1]
        tol = 1e-5 if s["cache"] == "int2" else 1e-2   # same fp32 op / bf16 FlashInfer-like
        assert s["rel_err_vs_oracle"] < tol, s


def test_int2_stack_equals_bf16_stack_while_context_fits_the_windows(bench):
    """Decode from an empty cache with the same forced tokens: while every position is in
    the BF16 sink/recent windows (L <= 12 for tiny) the INT2 stack reads only rotated BF16
    rows, so its logits match the BF16 stack's to bf16 rounding; past the windows INT2
    pages are read and the logits stay finite but move away."""
    cfg = bench.PRESETS["tiny"]
    weights = bench.DecodeWeights(cfg, torch.device("cpu"), seed=3)
    batch, n = 2, 20
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg.vocab_size, (batch, n), generator=gen)
    models = {k: _stack(bench, k, cfg, weights, batch, n) for k in ("bf16", "int2")}
    errs = []
    for s in range(n):
        logits = {}
        for kind, m in models.items():
            m.set_lengths([s + 1] * batch)
            m.tokens.copy_(tokens[:, s])
            m.attn_out.fill_(float("nan"))
            logits[kind] = m.step().float()
            assert bool(torch.isfinite(logits[kind]).all()), (kind, s)
        diff = (logits["int2"] - logits["bf16"]).norm() / logits["bf16"].norm()
        errs.append(float(diff))
    window = cfg.sink_size + cfg.recent_size
    assert max(errs[:window]) < 3e-2, errs
    assert max(errs[window + 2:]) > 2 * max(errs[:window]), errs   # INT2 pages now read


def test_capacity_report_matches_format_doc(bench):
    """Qwen3-8B geometry: 4096 B/token/layer BF16, 576 INT2 (docs/format.md section 6)."""
    cfg = bench.PRESETS["qwen3-8b"]
    spec = bench.int2_spec(cfg, 16, None)
    cap = bench.capacity_report(cfg, spec, 16, 100 << 30, [100000])
    assert cap["bf16_bytes_per_token_all_layers"] == 36 * 4096
    assert cap["int2_bytes_per_token_all_layers_int2_region"] == 36 * 576
    c = cap["per_context"][0]
    assert c["bf16_bytes_per_sequence"] == 36 * 100000 * 4096
    assert c["int2_bytes_per_sequence"] == 36 * (100000 * 576 + 320 * 4096)
    assert c["bf16_max_batch"] == 7 and c["int2_max_batch"] == 50


def test_bad_arguments_are_named(bench):
    with pytest.raises(ValueError, match="--preset"):
        bench.parse_args(["--preset", "qwen9"])
    with pytest.raises(ValueError, match="--tput-batches"):
        bench.parse_args(["--tput-batches", "1,x"])


def test_fused_triton_step_matches_torch_step_under_interpreter(bench):
    """The fused elementwise kernels (residual + RMSNorm, q/k norm + RoPE + split, SiLU*up)
    against the plain torch step on the same weights and caches, under TRITON_INTERPRET=1
    (set by tests/conftest.py on CPU machines; the interpreter rounds bf16 by truncation,
    hence a bf16-level tolerance)."""
    if not bench._TRITON or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs triton under TRITON_INTERPRET=1 (CPU)")
    cfg = bench.PRESETS["tiny"]
    weights = bench.DecodeWeights(cfg, torch.device("cpu"), seed=4)
    models = {f: _stack(bench, "bf16", cfg, weights, 2, 40) for f in (False, True)}
    for f, m in models.items():
        m.fused = f
    for lens in ([30, 21], [33, 2]):
        logits = {}
        for f, m in models.items():
            m.set_lengths(lens)
            m.tokens.copy_(torch.tensor([5, 77]))
            logits[f] = m.step().float()
        assert bool(torch.isfinite(logits[True]).all())
        err = float((logits[True] - logits[False]).norm() / logits[False].norm())
        assert err < 3e-2, (lens, err)


def test_fused_qkv_norm_rope_kernel_against_torch(bench):
    """q/k: RMSNorm with their own weights then RoPE at each row's position; v: copied."""
    if not bench._TRITON or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs triton under TRITON_INTERPRET=1 (CPU)")
    import torch.nn.functional as F
    cfg = bench.PRESETS["tiny"]
    hq, h, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
    gen = torch.Generator().manual_seed(9)
    qkv = torch.randn(3, (hq + 2 * h) * d, generator=gen).to(torch.bfloat16)
    pos = torch.tensor([0, 17, 9000], dtype=torch.int32)
    qn = (1 + 0.3 * torch.randn(d, generator=gen)).to(torch.bfloat16)
    kn = (1 + 0.3 * torch.randn(d, generator=gen)).to(torch.bfloat16)
    q, k, v = bench.qkv_norm_rope_triton(qkv, pos, qn, kn, cfg)
    half = d // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float32) / half))
    emb = (pos.float()[:, None] * inv[None])[:, None, :].repeat(1, 1, 2)
    rq, rk, rv = qkv.split([hq * d, h * d, h * d], -1)

    def rope(x):
        x1, x2 = x.float().chunk(2, -1)
        return x.float() * emb.cos() + torch.cat((-x2, x1), -1) * emb.sin()

    want_q = rope(F.rms_norm(rq.reshape(3, hq, d), (d,), qn, cfg.rms_eps))
    want_k = rope(F.rms_norm(rk.reshape(3, h, d), (d,), kn, cfg.rms_eps))
    for got, want in ((q, want_q), (k, want_k)):
        assert float((got.float() - want).norm() / want.norm()) < 1.5e-2
    assert torch.equal(v, rv.reshape(3, h, d))
