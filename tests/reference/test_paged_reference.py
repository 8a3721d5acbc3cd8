"""Paged append/decode/extend reference vs plain attention over the dequantized sequence."""

import itertools

import pytest
import torch

from helpers import (make_page_table, oracle_attention, poisoned_cache, random_rotation,
                     rel_err, i32)
from oscar_kernels import CacheSpec, ops
from oscar_kernels.reference.paged import dequantize_rows, gather_int2, page_view, rotate
from oscar_kernels.reference.quant import quantize_groups

# the oracle is float64 on identical dequantized values; the reference is float32
TOL = 2e-5


def _fill(spec, seq_lens, gen, *, num_qo_heads, per_head=True, dtype=torch.bfloat16):
    """A poisoned cache filled by one append call over all sequences."""
    kv_indptr, kv_indices, kv_last, num_pages = make_page_table(seq_lens, spec.page_size, gen)
    cache = poisoned_cache(spec, num_pages, len(seq_lens) + 2)
    slots = torch.randperm(len(seq_lens) + 2, generator=gen)[: len(seq_lens)].to(torch.int32)
    rot = random_rotation(spec.num_kv_heads, spec.head_dim, gen, per_head=per_head)
    ks = [torch.randn(n, spec.num_kv_heads, spec.head_dim, generator=gen).to(dtype) for n in seq_lens]
    vs = [torch.randn(n, spec.num_kv_heads, spec.head_dim, generator=gen).to(dtype) for n in seq_lens]
    b = i32(sum(([i] * n for i, n in enumerate(seq_lens)), []))
    p = i32(sum((list(range(n)) for n in seq_lens), []))
    order = torch.randperm(len(b), generator=gen)  # token order must not matter
    ops.quantize_append_paged_kv_cache(torch.cat(ks)[order], torch.cat(vs)[order], b[order],
                                       p[order], cache, kv_indices, kv_indptr, kv_last, slots, rot,
                                       backend="reference")
    return cache, (kv_indptr, kv_indices, kv_last, slots), rot, ks, vs


CASES = list(itertools.product([64, 128], [1, 3, 4, 8], [1, 16, 64]))


@pytest.mark.parametrize("head_dim,gqa,page_size", CASES)
def test_decode_matches_plain_attention(head_dim, gqa, page_size, gen):
    spec = CacheSpec(num_kv_heads=2, head_dim=head_dim, page_size=page_size,
                     group_size=head_dim if page_size != 16 else 32,
                     kv_layout="HND" if page_size == 16 else "NHD")
    # odd lengths, and lengths inside / at / around the sink and recent windows
    seq_lens = [1, 15, 113, 63, 64, 65, 319, 320, 321, 1023]
    cache, table, rot, ks, vs = _fill(spec, seq_lens, gen, num_qo_heads=2 * gqa)
    q = torch.randn(len(seq_lens), 2 * gqa, head_dim, generator=gen).to(torch.bfloat16)
    out, lse = ops.paged_decode_attention(q, cache, table[0], table[1], table[2], table[3], rot,
                                          backend="reference", return_lse=True)
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(lse).all())
    from oscar_kernels.reference.paged import paged_decode
    o32, _ = paged_decode(q, cache, *table[:3], table[3], *rot.per_head(2), head_dim ** -0.5)
    for b, n in enumerate(seq_lens):
        want = oracle_attention(q[b:b + 1], ks[b], vs[b], rot, spec, [n - 1])
        assert rel_err(o32[b:b + 1], want) < TOL, (b, n)


def test_int2_pages_hold_every_token_and_match_block_quantization(gen):
    spec = CacheSpec(num_kv_heads=3, head_dim=64, page_size=16, group_size=32)
    cache, table, rot, ks, vs = _fill(spec, [40, 333], gen, num_qo_heads=3)
    for b, n in enumerate([40, 333]):
        pages = table[1][int(table[0][b]):int(table[0][b + 1])]
        k_int2, _ = gather_int2(cache, pages, n)
        kr = rotate(ks[b], rot.rot_k)
        c, s, z = quantize_groups(kr, 32, rot.k_clip)
        from oscar_kernels.reference.quant import dequantize_groups
        assert torch.equal(k_int2, dequantize_groups(c, s, z, 32))


def test_window_rows(gen):
    spec = CacheSpec(num_kv_heads=1, head_dim=64, page_size=16, sink_size=4, recent_size=8)
    cache, table, rot, ks, vs = _fill(spec, [30], gen, num_qo_heads=1)
    slot = int(table[3][0])
    kr = rotate(ks[0], rot.rot_k).to(torch.bfloat16)
    assert torch.equal(cache.k_window[slot, :4], kr[:4])
    for p in range(22, 30):
        assert torch.equal(cache.k_window[slot, 4 + p % 8], kr[p])


def _decode_step_by_step(spec, seq_len, gen, gqa, dtype=torch.bfloat16):
    """Append one token at a time and decode after each: the serving loop."""
    kv_indptr, kv_indices, kv_last, num_pages = make_page_table([seq_len], spec.page_size, gen)
    cache = poisoned_cache(spec, num_pages, 1)
    rot = random_rotation(spec.num_kv_heads, spec.head_dim, gen)
    h, d = spec.num_kv_heads, spec.head_dim
    k = torch.randn(seq_len, h, d, generator=gen).to(dtype)
    v = torch.randn(seq_len, h, d, generator=gen).to(dtype)
    q = torch.randn(seq_len, h * gqa, d, generator=gen).to(dtype)
    outs = []
    for t in range(seq_len):
        n_pages = t // spec.page_size + 1
        indptr = i32([0, n_pages])
        last = i32([t % spec.page_size + 1])
        ops.quantize_append_paged_kv_cache(k[t:t + 1], v[t:t + 1], i32([0]), i32([t]), cache,
                                           kv_indices, indptr, last, i32([0]), rot,
                                           backend="reference")
        outs.append(ops.paged_decode_attention(q[t:t + 1], cache, indptr, kv_indices, last,
                                               i32([0]), rot, backend="reference").float())
    return torch.cat(outs), (k, v, q, rot, kv_indices)


@pytest.mark.parametrize("chunks", [[50], [3, 17, 1, 29], [12, 12, 12, 14]])
def test_extend_equals_token_by_token_decode(chunks, gen):
    spec = CacheSpec(num_kv_heads=2, head_dim=64, page_size=16, sink_size=4, recent_size=10)
    total = sum(chunks)
    dec, (k, v, q, rot, kv_indices) = _decode_step_by_step(spec, total, gen, gqa=2)
    cache = poisoned_cache(spec, int(kv_indices.max()) + 4, 2)
    outs, start = [], 0
    for n in chunks:
        end = start + n
        indptr = i32([0, (end - 1) // 16 + 1])
        last = i32([(end - 1) % 16 + 1])
        o = ops.paged_extend_attention(q[start:end], k[start:end], v[start:end], i32([0, n]),
                                       cache, indptr, kv_indices, last, i32([1]), rot,
                                       backend="reference")
        outs.append(o.float())
        start = end
    ext = torch.cat(outs)
    # same math in float32 with different summation; bf16 output rounding dominates
    assert rel_err(ext, dec) < 1e-2
    want = oracle_attention(q, k, v, rot, spec, list(range(total)))
    assert rel_err(ext, want) < 1e-2


@pytest.mark.parametrize("head_dim,gqa,page_size", [(64, 3, 1), (128, 8, 16), (64, 1, 64),
                                                     (128, 4, 64)])
def test_extend_batched_against_oracle(head_dim, gqa, page_size, gen):
    """Several sequences with a cached prefix each get a chunk; one extend call."""
    spec = CacheSpec(num_kv_heads=2, head_dim=head_dim, page_size=page_size, sink_size=8,
                     recent_size=32, kv_layout="HND" if page_size > 1 else "NHD")
    prefix = [0, 5, 40, 113, 300]
    chunk = [15, 1, 33, 50, 2]
    total = [a + b for a, b in zip(prefix, chunk)]
    kv_indptr, kv_indices, kv_last, num_pages = make_page_table(total, page_size, gen)
    cache = poisoned_cache(spec, num_pages, 5)
    slots = i32([4, 0, 3, 1, 2])
    rot = random_rotation(2, head_dim, gen)
    h, hq = 2, 2 * gqa
    ks = [torch.randn(n, h, head_dim, generator=gen).to(torch.bfloat16) for n in total]
    vs = [torch.randn(n, h, head_dim, generator=gen).to(torch.bfloat16) for n in total]
    qs = [torch.randn(n, hq, head_dim, generator=gen).to(torch.bfloat16) for n in chunk]
    # prefixes: one append call, page table at prefix lengths
    pre_last = i32([(n - 1) % page_size + 1 if n else 0 for n in prefix])
    pre_counts = [-(-n // page_size) for n in prefix]
    all_counts = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
    pre_indices = torch.cat([kv_indices[int(kv_indptr[b]):int(kv_indptr[b]) + pre_counts[b]]
                             for b in range(5)])
    pre_indptr = i32([0] + list(itertools.accumulate(pre_counts)))
    b_idx = i32(sum(([b] * n for b, n in enumerate(prefix)), []))
    pos = i32(sum((list(range(n)) for n in prefix), []))
    ops.quantize_append_paged_kv_cache(torch.cat([x[:n] for x, n in zip(ks, prefix)]),
                                       torch.cat([x[:n] for x, n in zip(vs, prefix)]),
                                       b_idx, pos, cache, pre_indices, pre_indptr, pre_last, slots,
                                       rot, backend="reference")
    assert all_counts  # page table for the full lengths
    qo = i32([0] + list(itertools.accumulate(chunk)))
    out = ops.paged_extend_attention(torch.cat(qs), torch.cat([x[p:] for x, p in zip(ks, prefix)]),
                                     torch.cat([x[p:] for x, p in zip(vs, prefix)]), qo, cache,
                                     kv_indptr, kv_indices, kv_last, slots, rot,
                                     backend="reference")
    for b in range(5):
        want = oracle_attention(qs[b], ks[b], vs[b], rot, spec,
                                list(range(prefix[b], total[b])))
        got = out[int(qo[b]):int(qo[b + 1])]
        assert rel_err(got, want) < 1e-2, b
    # after the extend the cache is in the decode state: decode the last token again
    q_last = torch.stack([x[-1] for x in qs])
    dec = ops.paged_decode_attention(q_last, cache, kv_indptr, kv_indices, kv_last, slots, rot,
                                     backend="reference")
    last_rows = torch.stack([out[int(qo[b + 1]) - 1] for b in range(5)])
    assert rel_err(dec, last_rows) < 1e-2


def test_empty_sequence_gives_zero_and_neg_inf(gen):
    spec = CacheSpec(num_kv_heads=1, head_dim=64, page_size=16)
    cache, table, rot, ks, vs = _fill(spec, [5], gen, num_qo_heads=1)
    indptr = i32([0, 1, 1])
    last = i32([5, 0])
    q = torch.randn(2, 1, 64, generator=gen)
    slots = i32([int(table[3][0]), (int(table[3][0]) + 1) % 3])
    out, lse = ops.paged_decode_attention(q, cache, indptr, table[1], last, slots, rot,
                                          backend="reference", return_lse=True)
    assert bool((out[1] == 0).all()) and lse[1, 0] == float("-inf")
    assert bool(torch.isfinite(out[0]).all())


def test_nan_token_does_not_poison_neighbours(gen):
    spec = CacheSpec(num_kv_heads=2, head_dim=64, page_size=4)
    kv_indptr, kv_indices, kv_last, num_pages = make_page_table([8], 4, gen)
    cache = poisoned_cache(spec, num_pages, 1)
    rot = random_rotation(2, 64, gen)
    k = torch.randn(8, 2, 64, generator=gen)
    v = torch.randn(8, 2, 64, generator=gen)
    k[3, 1, 7] = float("nan")
    ops.quantize_append_paged_kv_cache(k, v, i32([0] * 8), i32(range(8)), cache, kv_indices,
                                       kv_indptr, kv_last, i32([0]), rot, backend="reference")
    params = page_view(cache.k_params, "NHD")[kv_indices.long()].reshape(8, 2, 1, 2)
    assert bool(torch.isnan(params[3, 1]).all())
    ok = torch.ones(8, 2, dtype=torch.bool)
    ok[3, 1] = False
    assert bool(torch.isfinite(params[ok]).all())
    codes = page_view(cache.k_codes, "NHD")[kv_indices.long()].reshape(8, 2, 16)
    assert bool((codes[3, 1] == 0).all())
    deq = dequantize_rows(codes[ok], params[ok], 64)
    assert bool(torch.isfinite(deq).all())
