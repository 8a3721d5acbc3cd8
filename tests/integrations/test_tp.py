"""oscar_kernels.integrations.tp at the op level (CPU, reference backend): KV heads split
across simulated ranks, each with its own cache and its slice of the per-head rotations;
per-rank outputs concatenate to the single-rank output."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import i32, poisoned_cache, random_rotation
from oscar_kernels import CacheSpec, ops
from oscar_kernels.integrations.tp import kv_head_range, qo_head_range, shard_rotation


@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("tp_size,num_kv_heads", [(2, 4), (2, 2), (4, 2)])
def test_tp_ranks_concatenate_to_single_rank(tp_size, num_kv_heads, per_head, gen):
    gqa, d = 3, 64
    hq = num_kv_heads * gqa
    spec = CacheSpec(num_kv_heads=num_kv_heads, head_dim=d, page_size=16, sink_size=8,
                     recent_size=32)
    rot = random_rotation(num_kv_heads, d, gen, per_head=per_head)
    lens = [70, 133]
    nnz = sum(lens)
    k = torch.randn(nnz, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(nnz, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    q_ext = torch.randn(nnz, hq, d, generator=gen).to(torch.bfloat16)
    k_dec = torch.randn(2, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    v_dec = torch.randn(2, num_kv_heads, d, generator=gen).to(torch.bfloat16)
    q_dec = torch.randn(2, hq, d, generator=gen).to(torch.bfloat16)
    pages = [-(-(n + 1) // 16) for n in lens]
    ix = i32(list(range(sum(pages))))
    ip = i32([0, pages[0], sum(pages)])

    def run(heads, r, qh):
        s = dataclasses.replace(spec, num_kv_heads=heads[1] - heads[0])
        cache = poisoned_cache(s, sum(pages) + 1, 2)
        kk, vv = k[:, heads[0]:heads[1]], v[:, heads[0]:heads[1]]
        ip_e = i32([0, -(-lens[0] // 16), -(-lens[0] // 16) + -(-lens[1] // 16)])
        ix_e = torch.cat([ix[:-(-lens[0] // 16)], ix[pages[0]: pages[0] + -(-lens[1] // 16)]])
        last_e = i32([(n - 1) % 16 + 1 for n in lens])
        o_ext = ops.paged_extend_attention(q_ext[:, qh[0]:qh[1]], kk, vv, i32([0, lens[0], nnz]),
                                           cache, ip_e, ix_e, last_e, i32([0, 1]), r,
                                           backend="reference")
        last = i32([n % 16 + 1 for n in lens])
        ops.quantize_append_paged_kv_cache(k_dec[:, heads[0]:heads[1]], v_dec[:, heads[0]:heads[1]],
                                           i32([0, 1]), i32(lens), cache, ix, ip, last,
                                           i32([0, 1]), r, backend="reference")
        o_dec = ops.paged_decode_attention(q_dec[:, qh[0]:qh[1]], cache, ip, ix, last,
                                           i32([0, 1]), r, backend="reference")
        return o_ext, o_dec, cache

    full_ext, full_dec, full_cache = run((0, num_kv_heads), rot, (0, hq))
    parts = []
    for rank in range(tp_size):
        h0, h1 = kv_head_range(rank, tp_size, num_kv_heads)
        q0, q1 = qo_head_range(rank, tp_size, hq) if tp_size <= num_kv_heads else \
            (h0 * gqa, h1 * gqa)
        r_rank = shard_rotation(rot, h0, h1, num_kv_heads)
        assert r_rank.rot_k.shape[0] == (h1 - h0 if per_head else 1)
        o_ext, o_dec, cache = run((h0, h1), r_rank, (q0, q1))
        parts.append((q0, q1, o_ext, o_dec))
        # each rank's pages hold exactly the single-rank bytes of its heads
        assert torch.equal(cache.k_codes, full_cache.k_codes[:, :, h0:h1])
    if tp_size > num_kv_heads:  # replicated KV heads: ranks sharing a head agree
        for a, b in zip(parts, parts[1:]):
            if a[:2] == b[:2]:
                assert torch.equal(a[3], b[3])
        parts = list({p[0]: p for p in parts}.values())
    got_ext = torch.cat([p[2] for p in parts], dim=1)
    got_dec = torch.cat([p[3] for p in parts], dim=1)
    assert torch.equal(got_ext, full_ext)
    assert torch.equal(got_dec, full_dec)


def test_tp_helpers_errors():
    assert kv_head_range(3, 4, 8) == (6, 8)
    assert [kv_head_range(r, 8, 2) for r in range(8)] == [(0, 1)] * 4 + [(1, 2)] * 4
    with pytest.raises(ValueError, match="tp_size"):
        kv_head_range(0, 3, 8)
    with pytest.raises(ValueError, match="tp_rank"):
        kv_head_range(4, 4, 8)
