"""End-to-end decode benchmark: a model-shaped stack with a BF16 cache vs the OSCAR INT2 cache.

A minimal decode loop over real layer shapes (Qwen3-8B, Qwen3-4B; random bf16 weights):
token embedding, then per layer RMSNorm, fused QKV projection, per-head q/k RMSNorm,
neox RoPE, paged KV append, GQA decode attention, output projection, RMSNorm, SwiGLU MLP;
final RMSNorm, LM head and a greedy argmax that feeds the next step. Two attention stacks
run the same steps on the same weights:

* ``bf16``: a BF16 paged KV cache ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD)
  per layer, K/V appended by an index copy, attention by FlashInfer's
  ``BatchDecodeWithPagedKVCacheWrapper`` (tensor-core path, as SGLang uses for GQA >= 4)
  where it can run, torch SDPA over the gathered pages otherwise;
* ``int2``: one :class:`oscar_kernels.Int2PagedKVCache` per layer, written by
  ``ops.quantize_append_paged_kv_cache`` and read by ``ops.paged_decode_attention``
  (``backend="auto"``: CuTe on sm_90 when it implements the config, else Triton).

On a GPU one decode step (all layers) is captured in a CUDA graph per (batch size,
context) and timed by replaying it (``check_bounds=False`` inside the graph, after one
eager step with ``check_bounds=True``). Caches are filled with random data of realistic
scale (BF16 ~ N(0, 1); INT2 random codes with fp16 scales in [0.02, 0.5] and zero = -1.5
scale; BF16 windows ~ N(0, 1)): timing does not depend on the values. The graph replays
the same step (the new token is written to the same position each replay), so every
replay moves the same bytes. Reports:

1. KV bytes per token and the tokens that fit in a KV budget (``--kv-budget-gib``);
2. batch-1 decode latency per token at ``--latency-ctx``;
3. tokens/s at ``--tput-ctx`` for ``--tput-batches`` (``max`` = the largest batch the
   budget holds for each cache, capped by what the GPU holds beside the weights);
4. a PNG plot. Raw JSON, a markdown table and the plot go to ``--out-dir``.

Reproduce on one H200 (see perf/README.md for FlashInfer's offline site)::

    PYTHONPATH=. python perf/bench_e2e.py --preset qwen3-8b,qwen3-4b --out-dir perf/results

CPU smoke run (reference backend, torch SDPA, eager, times are not meaningful)::

    PYTHONPATH=. python perf/bench_e2e.py --preset tiny --device cpu --steps 2
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from oscar_kernels import ops  # noqa: E402
from oscar_kernels.cache import Int2PagedKVCache  # noqa: E402
from oscar_kernels.errors import expect  # noqa: E402
from oscar_kernels.rotation import LayerRotation  # noqa: E402
from oscar_kernels.spec import CacheSpec  # noqa: E402

log = logging.getLogger("bench_e2e")
GIB = 1 << 30
T_START = time.perf_counter()


# ------------------------------------------------------------------------------- presets
@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a decoder-only model (Qwen3 family)."""

    name: str
    num_layers: int
    hidden_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    sink_size: int = 64
    recent_size: int = 256

    @property
    def q_dim(self) -> int:
        return self.num_qo_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def weight_params(self) -> int:
        """Parameters of the stack as built here (fused QKV / gate-up, q/k norms)."""
        h, i = self.hidden_size, self.intermediate_size
        per_layer = (h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + 3 * h * i
                     + 2 * h + 2 * self.head_dim)
        head = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + head + h


PRESETS = {
    "qwen3-8b": ModelConfig("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, False),
    "qwen3-4b": ModelConfig("qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, True),
    "tiny": ModelConfig("tiny", 2, 128, 4, 2, 32, 256, 1000, False, 10_000.0, 1e-6, 4, 8),
}


# ------------------------------------------------------------------------------- weights
class DecodeWeights:
    """Random bf16 weights with the model's shapes (std ``1/sqrt(fan_in)``)."""

    def __init__(self, cfg: ModelConfig, device: torch.device, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        dt = torch.bfloat16

        def mat(out_f, in_f, std=None):
            w = torch.empty(out_f, in_f, dtype=dt, device=device)
            return w.normal_(0.0, std if std is not None else in_f ** -0.5, generator=gen)

        def norm(n):
            return torch.empty(n, dtype=dt, device=device).uniform_(0.8, 1.2, generator=gen)

        h = cfg.hidden_size
        self.embed = mat(cfg.vocab_size, h, std=1.0)
        self.layers = []
        for _ in range(cfg.num_layers):
            self.layers.append({
                "ln1": norm(h),
                "wqkv": mat(cfg.q_dim + 2 * cfg.kv_dim, h),
                "q_norm": norm(cfg.head_dim),
                "k_norm": norm(cfg.head_dim),
                "wo": mat(h, cfg.q_dim),
                "ln2": norm(h),
                "wgu": mat(2 * cfg.intermediate_size, h),
                "wdown": mat(h, cfg.intermediate_size),
            })
        self.norm = norm(h)
        self.lm_head = self.embed if cfg.tie_word_embeddings else mat(cfg.vocab_size, h)

    def tensors(self) -> list[torch.Tensor]:
        ts = [self.embed, self.norm] + [t for lw in self.layers for t in lw.values()]
        if self.lm_head is not self.embed:
            ts.append(self.lm_head)
        return ts

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


# --------------------------------------------------------------------------- page tables
class PageTable:
    """FlashInfer page table for ``batch_size`` sequences of the given lengths.

    Sequence ``b`` owns a fixed list of pages (``seq_pages[b]``, enough for
    ``max_len``), taken from a random permutation of the pool; a length ``L`` uses the
    first ``ceil(L / page_size)`` of them. All tensors are int32 on ``device`` and are
    updated in place by :meth:`set_lengths`, so a captured graph keeps its pointers.
    """

    def __init__(self, batch_size: int, max_len: int, page_size: int, num_pages: int,
                 device: torch.device, seed: int = 0):
        pages_per_seq = -(-max_len // page_size)
        expect(batch_size * pages_per_seq <= num_pages, "num_pages",
               f">= {batch_size * pages_per_seq} (batch {batch_size} x {pages_per_seq} pages)",
               num_pages)
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(num_pages, generator=gen)[: batch_size * pages_per_seq]
        self.seq_pages = perm.view(batch_size, pages_per_seq)
        self.batch_size, self.page_size, self.device = batch_size, page_size, device
        i32 = dict(dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(batch_size + 1, **i32)
        self.kv_indices = torch.zeros(batch_size * pages_per_seq, **i32)
        self.kv_last_page_len = torch.zeros(batch_size, **i32)
        self.positions = torch.zeros(batch_size, **i32)      # the new token's position
        self.new_slots = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.batch_indices = torch.arange(batch_size, **i32)
        self.window_slots = torch.arange(batch_size, **i32)
        self.seq_lens: list[int] = []

    def set_lengths(self, seq_lens: list[int]) -> None:
        """Lengths after this step's append (each >= 1); the new token is the last one."""
        ps = self.page_size
        counts = [-(-n // ps) for n in seq_lens]
        indptr = [0]
        for c in counts:
            indptr.append(indptr[-1] + c)
        indices = torch.cat([self.seq_pages[b, :c] for b, c in enumerate(counts)])
        last = [(n - 1) % ps + 1 for n in seq_lens]
        pos = [n - 1 for n in seq_lens]
        slots = [int(self.seq_pages[b, p // ps]) * ps + p % ps for b, p in enumerate(pos)]
        self.kv_indptr.copy_(torch.tensor(indptr, dtype=torch.int32))
        self.kv_indices[: indices.numel()].copy_(indices.to(torch.int32))
        self.kv_last_page_len.copy_(torch.tensor(last, dtype=torch.int32))
        self.positions.copy_(torch.tensor(pos, dtype=torch.int32))
        self.new_slots.copy_(torch.tensor(slots, dtype=torch.int64))
        self.seq_lens = list(seq_lens)
        self.num_used_pages = indptr[-1]


# ------------------------------------------------------------------------ attention stacks
class Bf16PagedAttention:
    """BF16 paged KV cache (NHD pages) with FlashInfer or torch-SDPA decode attention."""

    name = "bf16"

    def __init__(self, cfg: ModelConfig, *, page_size: int, num_pages: int,
                 device: torch.device, kernel: str = "auto"):
        self.cfg, self.page_size, self.num_pages, self.device = cfg, page_size, num_pages, device
        shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_pools = [torch.empty(shape, dtype=torch.bfloat16, device=device)
                        for _ in range(cfg.num_layers)]
        self.v_pools = [torch.empty(shape, dtype=torch.bfloat16, device=device)
                        for _ in range(cfg.num_layers)]
        self.kernel, self.kernel_note = self._pick_kernel(kernel)
        self.wrapper = None
        self.table: PageTable | None = None
        self.record_layer: int | None = None
        self.recorded: dict = {}

    def _pick_kernel(self, kernel: str) -> tuple[str, str]:
        expect(kernel in ("auto", "flashinfer", "sdpa"), "kernel",
               "one of ('auto', 'flashinfer', 'sdpa')", kernel)
        if kernel == "sdpa":
            return "sdpa", "requested"
        if self.device.type != "cuda":
            expect(kernel == "auto", "kernel", "'auto' or 'sdpa' on a CPU", kernel)
            return "sdpa", "no CUDA device"
        try:
            import flashinfer  # noqa: F401
        except Exception as exc:  # flashinfer missing or broken: SDPA baseline
            if kernel == "flashinfer":
                raise
            return "sdpa", f"flashinfer unavailable ({type(exc).__name__}: {str(exc)[:200]})"
        return "flashinfer", "flashinfer " + getattr(flashinfer, "__version__", "?")

    @property
    def bytes_per_token(self) -> int:
        return self.cfg.num_layers * 2 * self.cfg.kv_dim * 2

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k_pools + self.v_pools)

    def fill_random(self, seed: int) -> None:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for t in self.k_pools + self.v_pools:
            t.normal_(0.0, 1.0, generator=gen)

    def prepare(self, table: PageTable) -> None:
        """Bind the page table (lengths already set); plans FlashInfer on the host."""
        self.table = table
        if self.kernel != "flashinfer":
            max_pages = -(-max(table.seq_lens) // self.page_size)
            self._sdpa_pages = table.seq_pages[:, :max_pages].to(self.device)   # [B, P]
            lens = torch.tensor(table.seq_lens, device=self.device)
            self._sdpa_mask = (torch.arange(max_pages * self.page_size, device=self.device)[None]
                               < lens[:, None])[:, None, None]                 # [B, 1, 1, P*page]
            return
        import flashinfer
        cfg = self.cfg
        if self.wrapper is None:
            self._workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=self.device)
            self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_tensor_cores=True)
        n = table.num_used_pages
        self.wrapper.plan(table.kv_indptr, table.kv_indices[:n], table.kv_last_page_len,
                          cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, self.page_size,
                          q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:
        """Append ``k, v [B, H, D]`` at each sequence's last position, attend with ``q``."""
        cfg, t = self.cfg, self.table
        kp, vp = self.k_pools[layer], self.v_pools[layer]
        kp.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, t.new_slots, k)
        vp.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, t.new_slots, v)
        if self.kernel == "flashinfer":
            self.wrapper.run(q, (kp, vp), out=out)
        else:
            out.copy_(self._sdpa(q, kp, vp))
        if layer == self.record_layer:
            self.recorded = {"q": q.clone(), "out": out.clone()}
        return out

    def _sdpa(self, q, kp, vp):
        cfg = self.cfg
        k = kp[self._sdpa_pages].flatten(1, 2).transpose(1, 2)   # [B, H, P*page, D]
        v = vp[self._sdpa_pages].flatten(1, 2).transpose(1, 2)
        o = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=self._sdpa_mask,
                                           enable_gqa=cfg.num_qo_heads != cfg.num_kv_heads)
        return o[:, :, 0]

    def reference_attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """fp32 SDPA on the gathered pages of ``layer`` (the oracle for FlashInfer)."""
        t, cfg = self.table, self.cfg
        outs = []
        for b, n in enumerate(t.seq_lens):
            pages = t.seq_pages[b, : -(-n // self.page_size)].to(q.device)
            k = self.k_pools[layer][pages].flatten(0, 1)[:n].float()   # [n, H, D]
            v = self.v_pools[layer][pages].flatten(0, 1)[:n].float()
            g = cfg.num_qo_heads // cfg.num_kv_heads
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            s = torch.einsum("hd,nhd->hn", q[b].float(), k) / math.sqrt(cfg.head_dim)
            outs.append(torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v))
        return torch.stack(outs)


class Int2PagedAttention:
    """OSCAR INT2 paged cache (one :class:`Int2PagedKVCache` per layer) via ``ops``."""

    name = "int2"

    def __init__(self, cfg: ModelConfig, spec: CacheSpec, *, num_pages: int,
                 num_window_slots: int, device: torch.device, backend: str = "auto",
                 seed: int = 0):
        self.cfg, self.spec, self.device, self.backend = cfg, spec, device, backend
        self.caches = [Int2PagedKVCache.allocate(spec, num_pages, num_window_slots, device=device)
                       for _ in range(cfg.num_layers)]
        gen = torch.Generator().manual_seed(seed)
        self.rotations = []
        for _ in range(cfg.num_layers):  # one random orthogonal R_K, R_V per layer
            rk, rv = (_random_orthogonal(cfg.head_dim, gen) for _ in range(2))
            self.rotations.append(LayerRotation(rk[None].to(device), rv[None].to(device)))
        self.check_bounds = True
        self.table: PageTable | None = None
        self.record_layer: int | None = None
        self.recorded: dict = {}

    @property
    def bytes_per_token(self) -> int:
        return self.cfg.num_layers * self.spec.int2_bytes_per_token

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    def resolved_backends(self) -> dict:
        """Which backend ``backend`` resolves to for append and decode (``ops`` dispatch)."""
        res = {}
        cache = self.caches[0]
        for op, hq in (("append", self.cfg.num_kv_heads), ("decode", self.cfg.num_qo_heads)):
            try:
                name, _ = ops._dispatch(op, self.backend, cache.device,
                                        ops._config(cache, hq, torch.bfloat16))
            except Exception as exc:
                name = f"unavailable ({type(exc).__name__}: {str(exc)[:200]})"
            res[op] = name
        return res

    def fill_random(self, seed: int) -> None:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for c in self.caches:
            for codes in (c.k_codes, c.v_codes):
                codes.random_(0, 256, generator=gen)
            for params in (c.k_params, c.v_params):
                params[..., 0].uniform_(0.02, 0.5, generator=gen)
                params[..., 1].copy_(params[..., 0] * -1.5)
            for w in (c.k_window, c.v_window):
                w.normal_(0.0, 1.0, generator=gen)

    def prepare(self, table: PageTable) -> None:
        self.table = table

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:
        t, cache, rot = self.table, self.caches[layer], self.rotations[layer]
        n = t.num_used_pages
        ops.quantize_append_paged_kv_cache(
            k, v, t.batch_indices, t.positions, cache, t.kv_indices[:n], t.kv_indptr,
            t.kv_last_page_len, t.window_slots, rot, backend=self.backend,
            check_bounds=self.check_bounds)
        ops.paged_decode_attention(q, cache, t.kv_indptr, t.kv_indices[:n], t.kv_last_page_len,
                                   t.window_slots, rot, out=out, backend=self.backend,
                                   check_bounds=self.check_bounds)
        if layer == self.record_layer:
            self.recorded = {"q": q.clone(), "out": out.clone()}
        return out

    def reference_attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """The reference op on this layer's cache as it is now."""
        t = self.table
        n = t.num_used_pages
        return ops.paged_decode_attention(q, self.caches[layer], t.kv_indptr, t.kv_indices[:n],
                                          t.kv_last_page_len, t.window_slots,
                                          self.rotations[layer], backend="reference").float()


def _random_orthogonal(d: int, gen: torch.Generator) -> torch.Tensor:
    qm, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return (qm * torch.sign(torch.diagonal(r))[None, :]).to(torch.float32)


# ---------------------------------------------------------------- fused elementwise kernels
# The non-attention part of a step is a handful of GEMMs plus elementwise work; in plain
# torch the elementwise part is ~40 tiny kernels per layer, which at batch 1 costs as much
# as streaming the weights. A serving engine fuses them; so does this stack (``--fused``,
# the default on CUDA): residual add + RMSNorm, q/k RMSNorm + RoPE + the q/k/v split, and
# SiLU * up are one Triton kernel each. The torch path (CPU, ``--no-fused``) is the
# oracle the CPU test compares them against under ``TRITON_INTERPRET=1``.
try:
    import triton
    import triton.language as tl
    _TRITON = True
except ImportError:  # the torch path still runs
    _TRITON = False

if _TRITON:
    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, out_ptr, n, eps, HAS_D: tl.constexpr,
                            BLOCK: tl.constexpr):
        """Row ``b``: ``x += d`` (stored, bf16), ``out = rmsnorm(x) * w``."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_D:
            x = x + tl.load(d_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
            x = x.to(tl.bfloat16)
            tl.store(x_ptr + row * n + offs, x, mask=m)
            x = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n + offs, (x * r * w).to(tl.bfloat16), mask=m)

    @triton.jit
    def _qkv_norm_rope_kernel(qkv_ptr, pos_ptr, qn_ptr, kn_ptr, q_ptr, k_ptr, v_ptr,
                              num_qo_heads, num_kv_heads, eps, log2_theta,
                              D: tl.constexpr):
        """Program ``(b, head)`` of ``qkv [B, (Hq + 2H) * D]``: q/k heads get RMSNorm
        (rounded to bf16, as the torch path) then neox RoPE at ``pos[b]``; v heads are
        copied. Writes ``q [B, Hq, D]``, ``k [B, H, D]``, ``v [B, H, D]``."""
        b = tl.program_id(0).to(tl.int64)
        hd = tl.program_id(1)
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)
        row = qkv_ptr + (b * (num_qo_heads + 2 * num_kv_heads) + hd) * D
        x1 = tl.load(row + i).to(tl.float32)
        x2 = tl.load(row + half + i).to(tl.float32)
        if hd >= num_qo_heads + num_kv_heads:
            dst = v_ptr + (b * num_kv_heads + hd - num_qo_heads - num_kv_heads) * D
            tl.store(dst + i, x1.to(tl.bfloat16))
            tl.store(dst + half + i, x2.to(tl.bfloat16))
        else:
            if hd < num_qo_heads:
                w1 = tl.load(qn_ptr + i).to(tl.float32)
                w2 = tl.load(qn_ptr + half + i).to(tl.float32)
                dst = q_ptr + (b * num_qo_heads + hd) * D
            else:
                w1 = tl.load(kn_ptr + i).to(tl.float32)
                w2 = tl.load(kn_ptr + half + i).to(tl.float32)
                dst = k_ptr + (b * num_kv_heads + hd - num_qo_heads) * D
            r = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
            y1 = (x1 * r * w1).to(tl.bfloat16).to(tl.float32)
            y2 = (x2 * r * w2).to(tl.bfloat16).to(tl.float32)
            pos = tl.load(pos_ptr + b).to(tl.float32)
            ang = pos * tl.exp2(-(i.to(tl.float32) / half) * log2_theta)
            c = tl.cos(ang)
            s = tl.sin(ang)
            tl.store(dst + i, (y1 * c - y2 * s).to(tl.bfloat16))
            tl.store(dst + half + i, (y2 * c + y1 * s).to(tl.bfloat16))

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, inter, BLOCK: tl.constexpr):
        """``out[b] = bf16(silu(g)) * u`` with ``gu[b] = [g | u]``, ``[B, 2 * inter]``."""
        b = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < inter
        g = tl.load(gu_ptr + b * 2 * inter + offs, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + b * 2 * inter + inter + offs, mask=m, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32)
        tl.store(out_ptr + b * inter + offs, (act * u).to(tl.bfloat16), mask=m)


def add_rmsnorm_triton(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                       out: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [B, N]`` bf16 += ``delta`` (in place, when given); ``out = rmsnorm(x) * weight``."""
    n = x.shape[1]
    block = triton.next_power_of_2(n)
    _add_rmsnorm_kernel[(x.shape[0],)](x, delta if delta is not None else x, weight, out, n,
                                       eps, HAS_D=delta is not None, BLOCK=block,
                                       num_warps=min(16, max(1, block // 256)))
    return out


def qkv_norm_rope_triton(qkv: torch.Tensor, positions: torch.Tensor, q_norm: torch.Tensor,
                         k_norm: torch.Tensor, cfg: "ModelConfig"):
    """``qkv [B, (Hq + 2H) * D]`` → normed, rotated ``q [B, Hq, D]``, ``k``, ``v [B, H, D]``."""
    b, hq, h, d = qkv.shape[0], cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
    q = torch.empty(b, hq, d, dtype=torch.bfloat16, device=qkv.device)
    k = torch.empty(b, h, d, dtype=torch.bfloat16, device=qkv.device)
    v = torch.empty(b, h, d, dtype=torch.bfloat16, device=qkv.device)
    _qkv_norm_rope_kernel[(b, hq + 2 * h)](qkv, positions, q_norm, k_norm, q, k, v, hq, h,
                                           cfg.rms_eps, math.log2(cfg.rope_theta), D=d,
                                           num_warps=1)
    return q, k, v


def silu_mul_triton(gu: torch.Tensor) -> torch.Tensor:
    b, inter = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(b, inter, dtype=torch.bfloat16, device=gu.device)
    block = 1024
    _silu_mul_kernel[(b, triton.cdiv(inter, block))](gu, out, inter, BLOCK=block, num_warps=4)
    return out


# -------------------------------------------------------------------------------- model
class DecodeModel:
    """One greedy decode step over all layers for ``batch_size`` sequences.

    Static buffers (``tokens [B]`` int64, the page table) make :meth:`step` capturable
    in a CUDA graph: the step reads ``tokens``, writes the argmax back into it and
    leaves the logits ``[B, vocab_size]`` in :attr:`logits`.
    """

    def __init__(self, cfg: ModelConfig, weights: DecodeWeights, attention, table: PageTable,
                 *, fused: bool | None = None):
        self.cfg, self.w, self.attn, self.table = cfg, weights, attention, table
        if fused is None:
            fused = _TRITON and weights.embed.device.type == "cuda"
        expect(not fused or _TRITON, "fused", "False when triton is not importable", fused)
        self.fused = fused
        dev = weights.embed.device
        b = table.batch_size
        self.tokens = torch.zeros(b, dtype=torch.int64, device=dev)
        self.attn_out = torch.empty(b, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16,
                                    device=dev)
        half = cfg.head_dim // 2
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float32,
                                                               device=dev) / half))
        self.logits: torch.Tensor | None = None

    def set_lengths(self, seq_lens: list[int]) -> None:
        self.table.set_lengths(seq_lens)
        self.attn.prepare(self.table)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        xf = x.float()
        return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)

    def step(self) -> torch.Tensor:
        return self._step_fused() if self.fused else self._step_torch()

    def _step_fused(self) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        b, eps = self.table.batch_size, cfg.rms_eps
        x = F.embedding(self.tokens, w.embed)                         # residual [B, hidden]
        hs = torch.empty_like(x)
        add_rmsnorm_triton(x, None, w.layers[0]["ln1"], hs, eps)
        for i, lw in enumerate(w.layers):
            q, k, v = qkv_norm_rope_triton(F.linear(hs, lw["wqkv"]), self.table.positions,
                                           lw["q_norm"], lw["k_norm"], cfg)
            o = self.attn.forward(i, q, k, v, self.attn_out)
            add_rmsnorm_triton(x, F.linear(o.reshape(b, cfg.q_dim), lw["wo"]), lw["ln2"], hs,
                               eps)
            act = silu_mul_triton(F.linear(hs, lw["wgu"]))
            nxt = w.layers[i + 1]["ln1"] if i + 1 < len(w.layers) else w.norm
            add_rmsnorm_triton(x, F.linear(act, lw["wdown"]), nxt, hs, eps)
        self.logits = F.linear(hs, w.lm_head)
        self.tokens.copy_(self.logits.argmax(dim=-1))
        return self.logits

    def _step_torch(self) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        b, hq, h, d = self.table.batch_size, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        eps = cfg.rms_eps
        freqs = self.table.positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]          # [B, 1, D]
        cos, sin = emb.cos(), emb.sin()
        x = F.embedding(self.tokens, w.embed)                         # [B, hidden]
        for i, lw in enumerate(w.layers):
            hs = F.rms_norm(x, (cfg.hidden_size,), lw["ln1"], eps)
            q, k, v = F.linear(hs, lw["wqkv"]).split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim], -1)
            q = self._rope(F.rms_norm(q.reshape(b, hq, d), (d,), lw["q_norm"], eps), cos, sin)
            k = self._rope(F.rms_norm(k.reshape(b, h, d), (d,), lw["k_norm"], eps), cos, sin)
            o = self.attn.forward(i, q, k, v.reshape(b, h, d).contiguous(), self.attn_out)
            x = x + F.linear(o.reshape(b, cfg.q_dim), lw["wo"])
            hs = F.rms_norm(x, (cfg.hidden_size,), lw["ln2"], eps)
            g, u = F.linear(hs, lw["wgu"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, lw["wdown"])
        x = F.rms_norm(x, (cfg.hidden_size,), w.norm, eps)
        self.logits = F.linear(x, w.lm_head)
        self.tokens.copy_(self.logits.argmax(dim=-1))
        return self.logits

    def attention_only(self, q, k, v) -> None:
        """Append + attention of every layer on fixed ``q, k, v`` (the attention share)."""
        for i in range(self.cfg.num_layers):
            self.attn.forward(i, q, k, v, self.attn_out)


# ------------------------------------------------------------------------------ timing
def _harness():
    try:
        from perf import harness
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import harness  # type: ignore
    return harness


def median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else 0.5 * (ys[n // 2 - 1] + ys[n // 2])


# ---------------------------------------------------------------------------- capacity
def int2_spec(cfg: ModelConfig, page_size: int, group_size: int | None,
              kv_layout: str = "NHD") -> CacheSpec:
    return CacheSpec(num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, page_size=page_size,
                     group_size=group_size, sink_size=cfg.sink_size,
                     recent_size=cfg.recent_size, kv_layout=kv_layout)


def bf16_seq_bytes(cfg: ModelConfig, seq_len: int, page_size: int) -> int:
    """K+V bytes of one sequence over all layers in BF16 pages (whole pages)."""
    return cfg.num_layers * (-(-seq_len // page_size)) * page_size * 2 * cfg.kv_dim * 2


def int2_seq_bytes(cfg: ModelConfig, spec: CacheSpec, seq_len: int) -> int:
    """INT2 pages plus one BF16 window slot per layer (``CacheSpec.bytes_per_sequence``)."""
    return cfg.num_layers * spec.bytes_per_sequence(seq_len)


def capacity_report(cfg: ModelConfig, spec: CacheSpec, bf16_page: int, budget: int,
                    contexts: list[int]) -> dict:
    bf16_tok = cfg.num_layers * 2 * cfg.kv_dim * 2
    int2_tok = cfg.num_layers * spec.int2_bytes_per_token
    rep = {
        "kv_budget_bytes": budget,
        "bf16_bytes_per_token_all_layers": bf16_tok,
        "int2_bytes_per_token_all_layers_int2_region": int2_tok,
        "int2_window_bytes_per_sequence_all_layers": cfg.num_layers * spec.window_size
        * spec.bf16_bytes_per_token,
        "bf16_max_tokens_in_budget": budget // bf16_tok,
        "int2_max_tokens_in_budget_int2_region_only": budget // int2_tok,
        "per_context": [],
    }
    for n in contexts:
        bb, ib = bf16_seq_bytes(cfg, n, bf16_page), int2_seq_bytes(cfg, spec, n)
        rep["per_context"].append({
            "context": n, "bf16_bytes_per_sequence": bb, "int2_bytes_per_sequence": ib,
            "bf16_max_batch": budget // bb, "int2_max_batch": budget // ib,
            "bf16_max_tokens": (budget // bb) * n, "int2_max_tokens": (budget // ib) * n,
            "int2_effective_bits": spec.effective_bits(n),
            "bytes_ratio": bb / ib})
    return rep


# ------------------------------------------------------------------------------ env
def env_info(command: str, device: torch.device) -> dict:
    """``perf.harness.env_header`` (GPU, driver, versions, commit, date, command) plus
    the FlashInfer version; on a machine without ``.git`` set ``OSCAR_GIT_COMMIT``."""
    if device.type == "cuda":
        info = _harness().env_header(command)
    else:
        info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%d %H:%M:%S UTC"), "command": command,
                "python": platform.python_version(), "torch": torch.__version__}
    try:
        import flashinfer
        info["flashinfer"] = flashinfer.__version__
    except Exception as exc:
        info["flashinfer"] = f"unavailable: {type(exc).__name__}"
    return info


# ----------------------------------------------------------------------------- driver
class Runner:
    """Runs every configuration of one preset and one cache kind on one pool."""

    def __init__(self, args, cfg: ModelConfig, weights: DecodeWeights, device: torch.device):
        self.args, self.cfg, self.w, self.dev = args, cfg, weights, device
        self.use_graphs = device.type == "cuda" and not args.eager

    def build(self, kind: str, batch_size: int, max_len: int):
        cfg, a = self.cfg, self.args
        if kind == "bf16":
            pages = batch_size * -(-max_len // a.bf16_page_size)
            attn = Bf16PagedAttention(cfg, page_size=a.bf16_page_size, num_pages=pages,
                                      device=self.dev, kernel=a.bf16_attn)
            page_size = a.bf16_page_size
        else:
            spec = int2_spec(cfg, a.int2_page_size, a.group_size, a.int2_kv_layout)
            pages = batch_size * -(-max_len // spec.page_size)
            attn = Int2PagedAttention(cfg, spec, num_pages=pages, num_window_slots=batch_size,
                                      device=self.dev, backend=a.int2_backend, seed=a.seed)
            page_size = spec.page_size
        attn.fill_random(a.seed + 1)
        return attn, pages, page_size

    def run_config(self, attn, num_pages: int, page_size: int, batch_size: int,
                   context: int) -> dict:
        """Time one decode step at ``context`` tokens per sequence (after the append)."""
        cfg, a = self.cfg, self.args
        table = PageTable(batch_size, context, page_size, num_pages, self.dev, seed=a.seed)
        model = DecodeModel(cfg, self.w, attn, table, fused=a.fused)
        model.set_lengths([context] * batch_size)
        model.tokens.random_(0, cfg.vocab_size)
        res = {"batch_size": batch_size, "context": context, "fused_elementwise": model.fused}
        res.update(self._time(model, attn, batch_size))
        alt = (a.int2_also if isinstance(attn, Int2PagedAttention) and self.dev.type == "cuda"
               else None)
        if alt and attn.resolved_backends().get("decode") != alt:
            main_backend = attn.backend
            attn.backend = alt
            try:
                r2 = self._time(model, attn, batch_size)
                res["alt"] = {"backend": alt, "resolved": attn.resolved_backends(), **r2}
            except Exception as exc:
                res["alt"] = {"backend": alt, "error": f"{type(exc).__name__}: {exc}"[:500]}
                if self.dev.type == "cuda":
                    torch.cuda.synchronize()
            finally:
                attn.backend = main_backend
        return res

    def _time(self, model: "DecodeModel", attn, batch_size: int) -> dict:
        """One eager step (bounds checked, kernels compiled), then graph timings of the
        whole step and of the attention share."""
        cfg, a = self.cfg, self.args
        res = {}
        if hasattr(attn, "check_bounds"):
            attn.check_bounds = True
        t0 = time.perf_counter()
        model.step()                          # eager: compiles kernels, checks bounds once
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
        res["first_step_s"] = round(time.perf_counter() - t0, 3)
        res["logits_finite"] = bool(torch.isfinite(model.logits).all())
        if hasattr(attn, "check_bounds"):
            attn.check_bounds = False
        if not self.use_graphs:
            ts = []
            for _ in range(a.iters):
                t0 = time.perf_counter()
                model.step()
                ts.append((time.perf_counter() - t0) * 1e3)
            res.update(step_ms=median(ts), step_ms_all=ts, timing="eager wall clock (CPU)")
            return res
        hz = _harness()
        t = hz.time_cuda(model.step, warmup=a.warmup, rep=a.iters, graph=True, cold_l2=True)
        expect(t["mode"] == "graph", "decode step", "a CUDA-graph capture", t.get("graph_error"),
               RuntimeError)
        res.update(step_ms=t["median_ms"], step_timing=t)
        # attention share: append + attention of every layer, same table, fixed q/k/v
        gen = torch.Generator(device=self.dev).manual_seed(a.seed + 7)
        q = torch.randn(batch_size, cfg.num_qo_heads, cfg.head_dim, generator=gen,
                        device=self.dev).to(torch.bfloat16)
        k = torch.randn(batch_size, cfg.num_kv_heads, cfg.head_dim, generator=gen,
                        device=self.dev).to(torch.bfloat16)
        v = torch.randn_like(k)
        ta = hz.time_cuda(lambda: model.attention_only(q, k, v), warmup=a.warmup, rep=a.iters,
                          graph=True, cold_l2=True)
        expect(ta["mode"] == "graph", "attention", "a CUDA-graph capture",
               ta.get("graph_error"), RuntimeError)
        res.update(attn_ms=ta["median_ms"], attn_timing=ta)
        return res


def check_stack(attn, cfg: ModelConfig, weights: DecodeWeights, device, seq_lens: list[int],
                page_size: int, num_pages: int, seed: int, fused: bool | None = None) -> dict:
    """One eager step; the last layer's attention output against the stack's own oracle.

    When the step uses the fused elementwise kernels, the same step (same tokens, same
    positions: the append rewrites identical bytes) is also run on the plain torch path
    and the logits compared (``fused_vs_torch_logits_rel_err``, bf16-level expected).
    """
    table = PageTable(len(seq_lens), max(seq_lens), page_size, num_pages, device, seed=seed)
    model = DecodeModel(cfg, weights, attn, table, fused=fused)
    model.set_lengths(seq_lens)
    model.tokens.random_(0, cfg.vocab_size)
    tokens = model.tokens.clone()
    if hasattr(attn, "check_bounds"):
        attn.check_bounds = True
    attn.record_layer = cfg.num_layers - 1
    attn.recorded = {}
    model.attn_out.fill_(float("nan"))
    model.step()
    rec = attn.recorded
    attn.record_layer = None
    want = attn.reference_attention(cfg.num_layers - 1, rec["q"])
    got = rec["out"].float()
    err = float((got - want).norm() / want.norm().clamp_min(1e-30))
    res = {"cache": attn.name, "seq_lens": seq_lens, "layer": cfg.num_layers - 1,
           "rel_err_vs_oracle": err, "finite": bool(torch.isfinite(got).all()),
           "logits_finite": bool(torch.isfinite(model.logits).all()), "fused": model.fused}
    if model.fused:
        fused_logits = model.logits.float().clone()
        model.fused = False
        model.tokens.copy_(tokens)
        ref = model.step().float()
        res["fused_vs_torch_logits_rel_err"] = float((fused_logits - ref).norm()
                                                     / ref.norm().clamp_min(1e-30))
        res["fused_vs_torch_argmax_agree"] = float(
            (fused_logits.argmax(-1) == ref.argmax(-1)).float().mean())
    return res


def _fallback(attn) -> str | None:
    """Switch a stack whose fast path failed at run time to the next one; name it."""
    if getattr(attn, "kernel", None) == "flashinfer":
        attn.kernel, attn.kernel_note = "sdpa", "flashinfer failed at run time"
        attn.prepare(attn.table)
        return "torch SDPA"
    if getattr(attn, "backend", None) == "auto" and attn.resolved_backends().get("decode") == "cute":
        attn.backend = "triton"
        return "the Triton backend"
    return None


def resolve_batches(spec_list: list[str], max_batch: int) -> list[int]:
    out = []
    for s in spec_list:
        b = max_batch if s == "max" else int(s)
        if b not in out:
            out.append(b)
    return out


def run_preset(args, cfg: ModelConfig, device: torch.device, results: dict) -> None:
    spec = int2_spec(cfg, args.int2_page_size, args.group_size, args.int2_kv_layout)
    budget = int(args.kv_budget_gib * GIB)
    contexts = sorted(set(args.latency_ctx + [args.tput_ctx]))
    cap = capacity_report(cfg, spec, args.bf16_page_size, budget, contexts)
    results["capacity"][cfg.name] = cap
    log.info("[%s] capacity: BF16 %d B/token, INT2 %d B/token (all layers)", cfg.name,
             cap["bf16_bytes_per_token_all_layers"],
             cap["int2_bytes_per_token_all_layers_int2_region"])

    t0 = time.perf_counter()
    weights = DecodeWeights(cfg, device, seed=args.seed)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wbytes = weights.nbytes
    results["weights"][cfg.name] = {"bytes": wbytes, "params": cfg.weight_params(),
                                    "init_s": round(time.perf_counter() - t0, 2)}
    # bytes every step reads from the weights: all of them but the (untied) embedding table
    wread = wbytes - (0 if cfg.tie_word_embeddings else weights.embed.numel() * 2)
    bw = results.get("bandwidth") or {}
    bw_tbps = bw.get("read_TBps")
    runner = Runner(args, cfg, weights, device)
    tput = next(c for c in cap["per_context"] if c["context"] == args.tput_ctx)

    for kind in args.caches:
        seq_bytes = (lambda n: bf16_seq_bytes(cfg, n, args.bf16_page_size)) if kind == "bf16" \
            else (lambda n: int2_seq_bytes(cfg, spec, n))
        budget_max = budget // seq_bytes(args.tput_ctx)
        # what the GPU holds beside the weights (and a margin for activations/workspaces)
        gpu_max = budget_max
        if device.type == "cuda":
            free = torch.cuda.mem_get_info()[0] - int(args.gpu_margin_gib * GIB)
            gpu_max = max(0, free // seq_bytes(args.tput_ctx))
        max_batch = min(budget_max, gpu_max)
        note = None
        if gpu_max < budget_max:
            note = (f"{kind}: the budget holds batch {budget_max} at {args.tput_ctx} tokens, "
                    f"the GPU beside the weights only {gpu_max}: using {max_batch}")
            log.warning(note)
            results["notes"].append(note)
        batches = [b for b in resolve_batches(args.tput_batches, max_batch) if b >= 1]
        # latency configs (batch 1) and throughput configs (tput_ctx)
        configs = [("latency", 1, n) for n in args.latency_ctx]
        for b in batches:
            if b == 1 and args.tput_ctx in args.latency_ctx:
                continue
            configs.append(("throughput", b, args.tput_ctx))
        fits = [(role, b, n) for role, b, n in configs if b * seq_bytes(n) <= budget
                and b <= max(max_batch, 1)]
        for role, b, n in configs:
            if (role, b, n) not in fits:
                results["runs"].append({"preset": cfg.name, "cache": kind, "role": role,
                                        "batch_size": b, "context": n, "fits": False,
                                        "kv_bytes": b * seq_bytes(n), "kv_budget_bytes": budget})
        if not fits:
            continue
        pool_b = max(b for _, b, _ in fits)
        pool_len = max(n for _, _, n in fits)
        t0 = time.perf_counter()
        try:
            attn, num_pages, page_size = runner.build(kind, pool_b, pool_len)
        except torch.OutOfMemoryError as exc:
            results["errors"].append(f"{cfg.name}/{kind}: pool allocation: {exc}"[:500])
            continue
        if device.type == "cuda":
            torch.cuda.synchronize()
        pool_info = {"preset": cfg.name, "cache": kind, "pool_bytes": attn.nbytes,
                     "alloc_fill_s": round(time.perf_counter() - t0, 2)}
        if kind == "int2":
            pool_info["backends"] = attn.resolved_backends()
            pool_info["spec"] = {k: (str(v) if isinstance(v, torch.dtype) else v)
                                 for k, v in asdict(spec).items()}
        else:
            pool_info["kernel"] = attn.kernel
            pool_info["kernel_note"] = attn.kernel_note
            pool_info["page_size"] = args.bf16_page_size
        results["pools"].append(pool_info)
        log.info("[%s/%s] pool %.2f GiB (%s)", cfg.name, kind, attn.nbytes / GIB,
                 pool_info.get("backends") or pool_info.get("kernel"))
        if args.check:
            lens = [min(args.check_len, pool_len), max(1, min(args.check_len, pool_len) // 3)]
            lens = lens[: min(2, pool_b)]
            for attempt in range(2):
                try:
                    chk = check_stack(attn, cfg, weights, device, lens, page_size, num_pages,
                                      args.seed + 3, fused=args.fused)
                    chk.update(preset=cfg.name, kernel=getattr(attn, "kernel", None),
                               backend=getattr(attn, "backend", None))
                    results["checks"].append(chk)
                    log.info("[%s/%s] check: %s", cfg.name, kind, chk)
                    expect(chk["finite"] and chk["rel_err_vs_oracle"] <= args.check_tol,
                           f"{kind} attention", f"within {args.check_tol} of its oracle",
                           chk["rel_err_vs_oracle"], RuntimeError)
                    break
                except Exception as exc:
                    msg = f"{cfg.name}/{kind} check: {type(exc).__name__}: {exc}"[:800]
                    results["errors"].append(msg)
                    log.exception("check failed")
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    fallback = _fallback(attn)
                    if attempt or fallback is None:
                        break
                    results["notes"].append(f"{cfg.name}/{kind}: falling back to {fallback} "
                                            f"after: {msg[:300]}")
                    pool_info["fallback"] = fallback
        stop = False
        for role, b, n in fits:
            if time.perf_counter() - T_START > args.budget_s:
                if not stop:
                    results["notes"].append(f"time budget {args.budget_s} s spent: skipped "
                                            f"{cfg.name}/{kind} from B={b} L={n} on")
                stop = True
                results["runs"].append({"preset": cfg.name, "cache": kind, "role": role,
                                        "batch_size": b, "context": n, "fits": True,
                                        "skipped": "time budget", "kv_bytes": b * seq_bytes(n),
                                        "kv_budget_bytes": budget})
                continue
            r = None
            for attempt in range(2):
                try:
                    r = runner.run_config(attn, num_pages, page_size, b, n)
                    break
                except Exception as exc:
                    msg = f"{cfg.name}/{kind} B={b} L={n}: {type(exc).__name__}: {exc}"[:800]
                    results["errors"].append(msg)
                    log.exception("config failed")
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    fallback = None if attempt else _fallback(attn)
                    if fallback is None:
                        break
                    results["notes"].append(f"{cfg.name}/{kind}: falling back to {fallback} "
                                            f"after: {msg[:300]}")
                    pool_info["fallback"] = fallback
            if r is None:
                continue
            r["kernel"] = getattr(attn, "kernel", None) or attn.resolved_backends()
            kvb = b * seq_bytes(n)
            r.update(preset=cfg.name, cache=kind, role=role, fits=True, kv_bytes=kvb,
                     kv_budget_bytes=budget, weight_bytes_read=wread,
                     bytes_per_step=wread + kvb, tokens_per_s=b / (r["step_ms"] * 1e-3))
            r["step_TBps"] = (wread + kvb) / (r["step_ms"] * 1e-3) / 1e12
            if "attn_ms" in r:
                r["attn_TBps"] = kvb / (r["attn_ms"] * 1e-3) / 1e12
            if bw_tbps:
                r["floor_ms"] = (wread + kvb) / (bw_tbps * 1e12) * 1e3
            if b == tput["bf16_max_batch" if kind == "bf16" else "int2_max_batch"]:
                r["budget_limited_max_batch"] = True
            if b == max_batch:
                r["max_batch_run"] = True
            results["runs"].append(r)
            log.info("[%s/%s] %-10s B=%-3d L=%-6d step %.3f ms  attn %s ms  %.1f tok/s", cfg.name,
                     kind, role, b, n, r["step_ms"],
                     f"{r['attn_ms']:.3f}" if "attn_ms" in r else "-", r["tokens_per_s"])
            if args.out_dir:
                write_outputs(args, results, final=False)
        del attn
        gc.collect()   # exceptions caught by ops' auto dispatch keep frames (and pools) in cycles
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del weights, runner
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def read_bandwidth(device) -> dict | None:
    if device.type != "cuda":
        return None
    try:
        hz = _harness()
        bw = hz.measure_read_bandwidth()
        return bw if isinstance(bw, dict) else {"read_TBps": float(bw)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


# ---------------------------------------------------------------------------- outputs
def summary_table(results: dict) -> str:
    lines = []
    for name, cap in results["capacity"].items():
        lines.append(f"### {name}: KV capacity in a {cap['kv_budget_bytes'] / GIB:.0f} GiB budget\n")
        lines.append(f"BF16 {cap['bf16_bytes_per_token_all_layers']} B/token "
                     f"({cap['bf16_max_tokens_in_budget']:,} tokens); INT2 region "
                     f"{cap['int2_bytes_per_token_all_layers_int2_region']} B/token "
                     f"({cap['int2_max_tokens_in_budget_int2_region_only']:,} tokens), plus "
                     f"{cap['int2_window_bytes_per_sequence_all_layers']:,} B of BF16 windows "
                     f"per sequence\n")
        lines.append("| context | BF16 GB/seq | INT2 GB/seq | ratio | BF16 max batch | "
                     "INT2 max batch | INT2 bits/elem |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for c in cap["per_context"]:
            lines.append(f"| {c['context']} | {c['bf16_bytes_per_sequence'] / 1e9:.3f} | "
                         f"{c['int2_bytes_per_sequence'] / 1e9:.3f} | {c['bytes_ratio']:.2f}x | "
                         f"{c['bf16_max_batch']} | {c['int2_max_batch']} | "
                         f"{c['int2_effective_bits']:.2f} |")
        lines.append("")
    runs = [r for r in results["runs"]]
    for name in results["capacity"]:
        lines.append(f"### {name}: batch-1 latency per token (ms)\n")
        lines.append("| context | BF16 step | INT2 step | speedup | BF16 attn | INT2 attn | "
                     "attn speedup | BF16 floor | INT2 floor | floor speedup |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        lat = {(r["cache"], r["context"]): r for r in runs if r["preset"] == name
               and r.get("fits") and r["batch_size"] == 1}
        for n in sorted({c for _, c in lat}):
            b, i = lat.get(("bf16", n)), lat.get(("int2", n))
            lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                n, _fmt(b, "step_ms"), _fmt(i, "step_ms"), _ratio(b, i, "step_ms"),
                _fmt(b, "attn_ms"), _fmt(i, "attn_ms"), _ratio(b, i, "attn_ms"),
                _fmt(b, "floor_ms"), _fmt(i, "floor_ms"), _ratio(b, i, "floor_ms")))
        lines.append("\n(ms per decode step = per generated token; attn = KV append + attention "
                     "of all layers alone; floor = (weights read + KV bytes) / measured read "
                     "bandwidth)\n")
        lines.append("")
        lines.append(f"### {name}: throughput at {results['args']['tput_ctx']} tokens of context\n")
        lines.append("| cache | batch | fits budget | step ms | tokens/s | KV GB | attn ms | "
                     "achieved TB/s (step) | floor ms |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in sorted((r for r in runs if r["preset"] == name
                         and r["context"] == results["args"]["tput_ctx"]),
                        key=lambda r: (r["cache"], r["batch_size"])):
            mark = " (max)" if r.get("max_batch_run") else ""
            lines.append(f"| {r['cache']} | {r['batch_size']}{mark} | {'yes' if r['fits'] else 'no'}"
                         f"{' (skipped: ' + r['skipped'] + ')' if 'skipped' in r else ''} | {_fmt(r, 'step_ms')} | {_fmt(r, 'tokens_per_s', 1)} | "
                         f"{r['kv_bytes'] / 1e9:.1f} | {_fmt(r, 'attn_ms')} | {_fmt(r, 'step_TBps', 2)} | "
                         f"{_fmt(r, 'floor_ms')} |")
        best = {}
        for r in runs:
            if (r["preset"] == name and "tokens_per_s" in r
                    and r["context"] == results["args"]["tput_ctx"]):
                best[r["cache"]] = max(best.get(r["cache"], 0.0), r["tokens_per_s"])
        if "bf16" in best and "int2" in best:
            lines.append(f"\nBest tokens/s in the budget: INT2 {best['int2']:.1f} vs BF16 "
                         f"{best['bf16']:.1f} = {best['int2'] / best['bf16']:.2f}x")
        lines.append("")
    alts = [r for r in runs if "alt" in r and "step_ms" in r["alt"]]
    if alts:
        lines.append("### INT2 stack: `auto` backend vs the alternative forced backend\n")
        lines.append("| preset | batch | context | auto (decode) | step ms | attn ms | alternative | "
                     "step ms | attn ms |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in alts:
            lines.append(f"| {r['preset']} | {r['batch_size']} | {r['context']} | "
                         f"{(r.get('kernel') or {}).get('decode')} | {_fmt(r, 'step_ms')} | "
                         f"{_fmt(r, 'attn_ms')} | {r['alt']['backend']} | "
                         f"{_fmt(r['alt'], 'step_ms')} | {_fmt(r['alt'], 'attn_ms')} |")
        lines.append("")
    return "\n".join(lines)


def _fmt(r, key, digits=3):
    return "-" if r is None or key not in r else f"{r[key]:.{digits}f}"


def _ratio(b, i, key):
    if b is None or i is None or key not in b or key not in i:
        return "-"
    return f"{b[key] / i[key]:.2f}x"


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results["capacity"])
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 8), squeeze=False)
    tctx = results["args"]["tput_ctx"]
    for j, name in enumerate(names):
        ax = axes[0][j]
        for kind, color in (("bf16", "tab:gray"), ("int2", "tab:blue")):
            pts = sorted((r["context"], r["step_ms"]) for r in results["runs"]
                         if r["preset"] == name and r["cache"] == kind and r.get("fits")
                         and r["batch_size"] == 1 and "step_ms" in r)
            if pts:
                ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], "o-", color=color,
                        label=f"{kind.upper()} cache")
        pts = sorted((r["context"], r["alt"]["step_ms"]) for r in results["runs"]
                     if r["preset"] == name and r["cache"] == "int2" and r.get("fits")
                     and r["batch_size"] == 1 and "step_ms" in r.get("alt", {}))
        if pts:
            alt = next(r["alt"]["backend"] for r in results["runs"] if "alt" in r)
            ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], "s--", color="tab:cyan",
                    label=f"INT2 cache, {alt} backend forced")
        ax.set_xlabel("context (K tokens)")
        ax.set_ylabel("ms per token (batch 1)")
        ax.set_title(f"{name}: batch-1 decode latency")
        ax.grid(alpha=0.3)
        ax.legend()
        ax = axes[1][j]
        rows = sorted((r for r in results["runs"] if r["preset"] == name
                       and r["context"] == tctx and r.get("fits") and "tokens_per_s" in r),
                      key=lambda r: (r["cache"], r["batch_size"]))
        labels = [f"{r['cache'].upper()}\nB={r['batch_size']}" for r in rows]
        colors = ["tab:gray" if r["cache"] == "bf16" else "tab:blue" for r in rows]
        bars = ax.bar(range(len(rows)), [r["tokens_per_s"] for r in rows], color=colors)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(range(len(rows)), labels)
        ax.set_ylabel("tokens/s")
        budget = results["capacity"][name]["kv_budget_bytes"] / GIB
        ax.set_title(f"{name}: throughput at {tctx} tokens, {budget:.0f} GiB KV budget")
        ax.grid(alpha=0.3, axis="y")
    gpu = results["env"].get("gpu", results["env"].get("host"))
    fig.suptitle(f"Decode steps (CUDA graphs): BF16 cache vs OSCAR INT2 cache, {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(args, results: dict, final: bool) -> None:
    """JSON (+ Markdown summary and PNG when ``final``) under ``--out-dir`` via the harness."""
    payload = {k: v for k, v in results.items() if k != "env"}
    text = summary_table(results) if final else "(partial: run still in progress)"
    if results["notes"]:
        text += "\n\nNotes:\n" + "\n".join(f"- {n}" for n in results["notes"])
    if results["errors"]:
        text += "\n\nErrors:\n" + "\n".join(f"- {e}" for e in results["errors"])
    _harness().write_results(args.tag, results["env"], payload, text, out_dir=args.out_dir)
    if final and not args.no_plot:
        try:
            plot(results, os.path.join(args.out_dir, args.tag + ".png"))
        except Exception as exc:
            results["errors"].append(f"plot: {type(exc).__name__}: {exc}")


# ------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--preset", default="qwen3-8b,qwen3-4b",
                   help=f"comma list of {sorted(PRESETS)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--caches", default="bf16,int2")
    p.add_argument("--kv-budget-gib", type=float, default=100.0)
    p.add_argument("--gpu-margin-gib", type=float, default=6.0,
                   help="GPU memory kept free beside weights and KV (activations, workspaces)")
    p.add_argument("--latency-ctx", type=ints, default=[8192, 32768, 65536, 100000])
    p.add_argument("--tput-ctx", type=int, default=100000)
    p.add_argument("--tput-batches", default="1,8,32,max")
    p.add_argument("--bf16-page-size", type=int, default=16)
    p.add_argument("--int2-page-size", type=int, default=16)
    p.add_argument("--int2-kv-layout", default="NHD", choices=["NHD", "HND"],
                   help="page layout of the INT2 cache (HND: one head's chunk is contiguous)")
    p.add_argument("--group-size", type=int, default=None, help="INT2 group size (default D)")
    p.add_argument("--bf16-attn", default="auto", choices=["auto", "flashinfer", "sdpa"])
    p.add_argument("--int2-backend", default="auto",
                   choices=["auto", "cute", "triton", "reference"])
    p.add_argument("--iters", type=int, default=10, help="timed replays per configuration")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (wall-clock steps)")
    p.add_argument("--no-fused", dest="fused", action="store_const", const=False, default=None,
                   help="plain torch elementwise ops (default: fused Triton kernels on CUDA)")
    p.add_argument("--int2-also", default="triton", choices=["", "triton", "cute"],
                   help="also time the INT2 stack with this backend forced, when 'auto' "
                        "resolves to another ('' = off)")
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--check-len", type=int, default=1500)
    p.add_argument("--check-tol", type=float, default=2e-2,
                   help="largest relative error of a stack's attention against its oracle")
    p.add_argument("--steps", type=int, default=None,
                   help="CPU smoke mode: run this many eager steps of the tiny preset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--tag", default=None)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--budget-s", type=float, default=1e9,
                   help="skip the remaining configurations once this many seconds have passed")
    p.add_argument("--replot", default=None,
                   help="rewrite the Markdown summary and PNG of an existing results JSON")
    args = p.parse_args(argv)
    args.presets = [s for s in args.preset.split(",") if s]
    for s in args.presets:
        expect(s in PRESETS, "--preset", f"names from {sorted(PRESETS)}", s)
    args.caches = [s for s in args.caches.split(",") if s]
    for s in args.caches:
        expect(s in ("bf16", "int2"), "--caches", "bf16 and/or int2", s)
    args.tput_batches = [s for s in args.tput_batches.split(",") if s]
    for s in args.tput_batches:
        expect(s == "max" or s.isdigit(), "--tput-batches", "ints or 'max'", s)
    return args


def smoke(args, device) -> dict:
    """``--steps N``: N eager decode steps from a short prefix, both stacks, with checks."""
    cfg = PRESETS[args.presets[0]]
    weights = DecodeWeights(cfg, device, seed=args.seed)
    spec = int2_spec(cfg, args.int2_page_size, args.group_size, args.int2_kv_layout)
    prefix, steps, batch = args.check_len, args.steps, 2
    out = {"preset": cfg.name, "steps": []}
    for kind in args.caches:
        page = args.bf16_page_size if kind == "bf16" else spec.page_size
        pages = batch * -(-(prefix + steps) // page)
        attn = (Bf16PagedAttention(cfg, page_size=page, num_pages=pages, device=device,
                                   kernel=args.bf16_attn) if kind == "bf16" else
                Int2PagedAttention(cfg, spec, num_pages=pages, num_window_slots=batch,
                                   device=device, backend=args.int2_backend, seed=args.seed))
        attn.fill_random(args.seed + 1)
        table = PageTable(batch, prefix + steps, page, pages, device, seed=args.seed)
        model = DecodeModel(cfg, weights, attn, table)
        model.tokens.random_(0, cfg.vocab_size)
        for s in range(steps):
            model.set_lengths([prefix + s + 1, prefix // 2 + s + 1])
            attn.record_layer = cfg.num_layers - 1
            model.step()
            want = attn.reference_attention(cfg.num_layers - 1, attn.recorded["q"])
            got = attn.recorded["out"].float()
            out["steps"].append({
                "cache": kind, "step": s, "seq_lens": list(table.seq_lens),
                "logits_finite": bool(torch.isfinite(model.logits).all()),
                "rel_err_vs_oracle": float((got - want).norm() / want.norm().clamp_min(1e-30)),
                "tokens": model.tokens.tolist()})
    return out


def main(argv=None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    device = torch.device(args.device)
    argv_list = sys.argv[1:] if argv is None else list(argv)
    command = "PYTHONPATH=. python perf/bench_e2e.py " + " ".join(shlex.quote(a) for a in argv_list)
    if args.tag is None:
        gpu = torch.cuda.get_device_name(0).replace(" ", "_") if device.type == "cuda" else "cpu"
        args.tag = f"e2e_{gpu}_{datetime.date.today().isoformat()}"
    expect("e2e" in args.tag, "--tag", "a name containing 'e2e'", args.tag)
    if args.replot:
        with open(args.replot) as f:
            results = json.load(f)
        args.out_dir = os.path.dirname(os.path.abspath(args.replot))
        args.tag = os.path.basename(args.replot)[: -len(".json")]
        write_outputs(args, results, final=True)
        print(summary_table(results))
        return results
    if args.steps is not None:
        res = smoke(args, device)
        print(json.dumps(res, indent=1))
        return res
    results = {"command": command, "args": {k: v for k, v in vars(args).items()},
               "env": env_info(command, device), "capacity": {}, "weights": {}, "pools": [], "checks": [],
               "runs": [], "notes": [], "errors": []}
    results["method"] = (
        "One decode step of all layers per CUDA-graph replay (batch B, every sequence at "
        "`context` tokens after appending the new one); median of --iters replays timed with "
        "CUDA events each, after --warmup replays. Caches hold random data of realistic scale; "
        "timing is data-independent. attn_ms: a second graph with only the KV append and "
        "attention of every layer. kv_bytes: K+V bytes of the batch's sequences in the cache "
        "(whole pages; INT2 includes one BF16 window slot per sequence and layer).")
    log.info("env: %s", results["env"])
    results["bandwidth"] = read_bandwidth(device)
    for name in args.presets:
        run_preset(args, PRESETS[name], device, results)
        if args.out_dir:
            write_outputs(args, results, final=False)
    if args.out_dir:
        write_outputs(args, results, final=True)
    print(summary_table(results))
    for e in results["errors"]:
        print("ERROR", e)
    return results


if __name__ == "__main__":
    main()
