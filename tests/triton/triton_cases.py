"""Builders shared by the Triton interpreter (CPU) and GPU tests.

A case is a filled cache (written by the *reference* append, so attention tests isolate
the attention kernels), its page table, random rotations and queries. Everything random
comes from a seeded generator on the CPU and is moved to the device.
"""

from __future__ import annotations

import math

import torch

from helpers import make_page_table, poisoned_cache, random_rotation
from oscar_kernels.reference import paged as ref
from oscar_kernels.reference.quant import unpack_codes


def build_case(spec, lens, num_qo_heads, gen, *, device="cpu", prefix_lens=None,
               spare_slots=1, per_head=True):
    """Cache holding ``prefix_lens`` (default ``lens``) tokens per sequence, page table for ``lens``.

    Returns a dict with ``cache``, ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``,
    ``window_slots``, ``rot`` (LayerRotation), ``k``/``v`` (all ``sum(lens)`` tokens,
    model space, bf16, sequence-major), ``lens``, ``prefix_lens``.
    """
    prefix_lens = list(lens) if prefix_lens is None else list(prefix_lens)
    h, d, ps = spec.num_kv_heads, spec.head_dim, spec.page_size
    indptr, indices, last, num_pages = make_page_table(lens, ps, gen)
    batch = len(lens)
    perm = torch.randperm(batch + spare_slots, generator=gen)[:batch].to(torch.int32)
    rot = random_rotation(h, d, gen, per_head=per_head)
    total = sum(lens)
    k = (torch.randn(total, h, d, generator=gen) * 2 + 0.5).to(torch.bfloat16)
    v = torch.randn(total, h, d, generator=gen).to(torch.bfloat16)
    cache = poisoned_cache(spec, num_pages, batch + spare_slots, device=device)
    dev = torch.device(device)
    case = dict(cache=cache, kv_indptr=indptr.to(dev), kv_indices=indices.to(dev),
                kv_last_page_len=last.to(dev), window_slots=perm.to(dev),
                rot=rot.to(dev) if hasattr(rot, "to") else rot, k=k.to(dev), v=v.to(dev),
                lens=list(lens), prefix_lens=prefix_lens)
    if sum(prefix_lens):
        pt = prefix_table(indptr, indices, lens, prefix_lens, ps)
        sel = torch.cat([torch.arange(o, o + n) for o, n in
                         zip(offsets(lens), prefix_lens)]).to(dev)
        bi = torch.repeat_interleave(torch.arange(batch), torch.tensor(prefix_lens)).to(torch.int32)
        pos = torch.cat([torch.arange(n) for n in prefix_lens]).to(torch.int32)
        rk, rv = rot_heads(case["rot"], h)
        ref.append_paged_kv(cache, case["k"][sel], case["v"][sel], bi.to(dev), pos.to(dev),
                            pt[1].to(dev), pt[0].to(dev), pt[2].to(dev), case["window_slots"],
                            rk, rv, rot.k_clip, rot.v_clip)
    case["q"] = torch.randn(batch, num_qo_heads, d, generator=gen).to(torch.bfloat16).to(dev)
    return case


def offsets(lens):
    out, acc = [], 0
    for n in lens:
        out.append(acc)
        acc += n
    return out


def prefix_table(indptr, indices, lens, prefix_lens, page_size):
    """Page table of the first ``prefix_lens[b]`` tokens using the same pages as ``lens``."""
    ip, new_ip, idx, last = indptr.tolist(), [0], [], []
    for b, n in enumerate(prefix_lens):
        npg = -(-n // page_size)
        idx.extend(indices[ip[b]: ip[b] + npg].tolist())
        new_ip.append(new_ip[-1] + npg)
        last.append((n - 1) % page_size + 1 if n > 0 else 0)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    return i32(new_ip), i32(idx), i32(last)


def rot_heads(rot, h):
    return rot.rot_k.expand(h, -1, -1), rot.rot_v.expand(h, -1, -1)


def used_pages(case):
    return case["kv_indices"][: int(case["kv_indptr"][-1])].long()


def compare_codes(packed_a, packed_b):
    """Fraction of codes that differ and the largest level difference."""
    a = unpack_codes(packed_a).to(torch.int16)
    b = unpack_codes(packed_b).to(torch.int16)
    diff = (a - b).abs()
    return float((diff > 0).float().mean()) if diff.numel() else 0.0, int(diff.max()) if diff.numel() else 0


def bf16_decode_baseline(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots,
                         rot_k, rot_v, sm_scale):
    """``paged_decode`` computed in bf16 (q', K, V, scores, probabilities) on the same
    dequantized/window values: the error yardstick for kernels."""
    spec = cache.spec
    seq_lens = ref.seq_lens_from_page_table(kv_indptr, kv_last_page_len, spec.page_size)
    q_rot = ref.rotate_queries(q, rot_k).to(torch.bfloat16)
    hq = q.shape[1]
    g = hq // spec.num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        if n == 0:
            continue
        _, _, kf, vf = ref._sequence_kv(cache, b, n, kv_indices, kv_indptr, window_slots)
        kb = kf.to(torch.bfloat16).repeat_interleave(g, dim=1)           # [L, Hq, D]
        vb = vf.to(torch.bfloat16).repeat_interleave(g, dim=1)
        s = torch.einsum("hd,lhd->hl", q_rot[b], kb) * sm_scale
        p = torch.softmax(s.float(), dim=-1).to(torch.bfloat16)
        out[b] = torch.einsum("hl,lhd->hd", p, vb).float()
    return ref.unrotate_output(out, rot_v)


def default_scale(d):
    return 1.0 / math.sqrt(d)
