"""Shared builders for tests: page tables, random rotations, an independent oracle."""

from __future__ import annotations

import math

import torch

from oscar_kernels import CacheSpec, Int2PagedKVCache, LayerRotation
from oscar_kernels.reference.quant import dequantize_groups, quantize_groups

POISON_BYTE = 0xA5


def i32(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.int32)


def random_orthogonal(num_heads: int, d: int, gen: torch.Generator) -> torch.Tensor:
    a = torch.randn(num_heads, d, d, generator=gen, dtype=torch.float64)
    qm, r = torch.linalg.qr(a)
    qm = qm * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    return qm.to(torch.float32)


def random_rotation(num_kv_heads: int, d: int, gen: torch.Generator, *, per_head: bool = True,
                    k_clip: float = 0.96, v_clip: float = 0.92) -> LayerRotation:
    h = num_kv_heads if per_head else 1
    return LayerRotation(random_orthogonal(h, d, gen), random_orthogonal(h, d, gen),
                         k_clip, v_clip)


def make_page_table(seq_lens, page_size: int, gen: torch.Generator, spare_pages: int = 3):
    """Pages in a random order across sequences (so page ids are not contiguous)."""
    counts = [-(-int(n) // page_size) for n in seq_lens]
    num_pages = sum(counts) + spare_pages
    perm = torch.randperm(num_pages, generator=gen)
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    indices = perm[: indptr[-1]]
    last = [(int(n) - 1) % page_size + 1 if n > 0 else 0 for n in seq_lens]
    return i32(indptr), i32(indices), i32(last), num_pages


def poisoned_cache(spec: CacheSpec, num_pages: int, num_slots: int, device="cpu"):
    cache = Int2PagedKVCache.allocate(spec, num_pages, num_slots, device=device)
    for name, t in cache.tensors().items():
        if t.dtype == torch.uint8:
            t.fill_(POISON_BYTE)
        else:
            t.fill_(float("nan"))
    return cache


def oracle_attention(q, k_seq, v_seq, rot: LayerRotation, spec: CacheSpec, q_positions,
                     sm_scale=None):
    """Plain float64 attention over the *independently* quantized sequence.

    ``q [Nq, Hq, D]``, ``k_seq/v_seq [L, H, D]`` in the model's space. The sequence is
    rotated, quantized as one block (no pages), dequantized; query at position t reads
    position p in BF16 when p < sink or p > t - recent. Returns ``[Nq, Hq, D]`` float64.
    """
    h, d = spec.num_kv_heads, spec.head_dim
    rk, rv = rotation_heads(rot, h)
    kr = torch.einsum("lhd,hde->lhe", k_seq.float(), rk)
    vr = torch.einsum("lhd,hde->lhe", v_seq.float(), rv)
    deq = []
    for x, ratio in ((kr, rot.k_clip), (vr, rot.v_clip)):
        c, s, z = quantize_groups(x, spec.group_size, ratio, spec.scale_dtype)
        deq.append(dequantize_groups(c, s, z, spec.group_size).double())
    kb, vb = kr.to(torch.bfloat16).double(), vr.to(torch.bfloat16).double()
    hq = q.shape[1]
    g = hq // h
    qr = torch.einsum("qhd,hde->qhe", q.double(), rk.double().repeat_interleave(g, 0))
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, t in enumerate(q_positions):
        t = int(t)
        for head in range(hq):
            kvh = head // g
            ks, vs = [], []
            for p in range(t + 1):
                full = p < spec.sink_size or p > t - spec.recent_size
                ks.append((kb if full else deq[0])[p, kvh])
                vs.append((vb if full else deq[1])[p, kvh])
            kk, vv = torch.stack(ks), torch.stack(vs)
            w = torch.softmax(kk @ qr[i, head] * scale, dim=0)
            out[i, head] = (w @ vv) @ rv[kvh].double().T
    return out


def rotation_heads(rot: LayerRotation, h: int):
    return rot.rot_k.expand(h, -1, -1).float(), rot.rot_v.expand(h, -1, -1).float()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
