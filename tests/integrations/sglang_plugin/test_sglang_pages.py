"""oscar_kernels.integrations.sglang.pages: page tables from SGLang's req_to_token rows and
a window slot rebuilt from shared pages (no SGLang needed)."""

from __future__ import annotations

import torch

from helpers import i32, poisoned_cache, random_rotation
from oscar_kernels import CacheSpec, ops
from oscar_kernels.integrations.sglang.pages import (page_table_from_req_to_token,
                                                     rebuild_window_from_pages)
from oscar_kernels.page import get_seq_lens
from oscar_kernels.reference.paged import gather_int2, rotate

HEADS, GQA, D, PAGE = 2, 4, 64, 16


def _table(page_ids, length):
    n = -(-length // PAGE)
    return i32([0, n]), i32(page_ids[:n]), i32([(length - 1) % PAGE + 1])


# ------------------------------------------------------------ plugin helpers (no sglang)
def test_page_table_from_req_to_token(gen):
    for page_size in (1, 4):
        req_to_token = torch.zeros(6, 64, dtype=torch.int32)
        free = torch.randperm(60, generator=gen) + 1  # page ids, 0 is SGLang's padding page
        lens = [13, 1, 30]
        rows = [4, 0, 2]
        k = 0
        for r, n in zip(rows, lens):
            npg = -(-n // page_size)
            pg = free[k:k + npg]
            k += npg
            slots = (pg[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:n]
            req_to_token[r, :n] = slots.to(torch.int32)
        ip, ix, last = page_table_from_req_to_token(req_to_token, i32(rows), i32(lens),
                                                    page_size)
        want_pages = [-(-n // page_size) for n in lens]
        assert ip.tolist() == [0, want_pages[0], sum(want_pages[:2]), sum(want_pages)]
        assert ix.tolist() == free[:sum(want_pages)].tolist()
        assert last.tolist() == [(n - 1) % page_size + 1 for n in lens]
        assert torch.equal(get_seq_lens(ip, last, page_size), i32(lens))


def test_stale_window_is_not_served_and_pages_rebuild_is_deterministic(gen):
    """Without the rebuild a reused slot serves stale rows (the failure the plugin
    prevents); the plugin's rebuild-from-pages gives every request reusing the prefix the
    same output, whatever its slot held before."""
    spec = CacheSpec(num_kv_heads=HEADS, head_dim=D, page_size=PAGE, sink_size=8,
                     recent_size=24)
    rot = random_rotation(HEADS, D, gen)
    n = 100
    k = torch.randn(n, HEADS, D, generator=gen).to(torch.bfloat16)
    v = torch.randn(n, HEADS, D, generator=gen).to(torch.bfloat16)
    q = torch.randn(n, HEADS * GQA, D, generator=gen).to(torch.bfloat16)
    cache = poisoned_cache(spec, 16, 4)
    ids = list(range(8))
    ip, ix, last = _table(ids, n)
    ops.paged_extend_attention(q, k, v, i32([0, n]), cache, ip, ix, last, i32([0]), rot,
                               backend="reference")
    qn = torch.randn(1, HEADS * GQA, D, generator=gen).to(torch.bfloat16)
    outs = []
    for slot in (1, 2):
        cache.k_window[slot] = torch.randn(cache.k_window.shape[1:], generator=gen).to(
            torch.bfloat16)
        cache.v_window[slot] = torch.randn(cache.v_window.shape[1:], generator=gen).to(
            torch.bfloat16)
        stale = ops.paged_decode_attention(qn, cache, ip, ix, last, i32([slot]), rot,
                                           backend="reference")
        rebuild_window_from_pages(cache, ix, slot, n)
        outs.append(ops.paged_decode_attention(qn, cache, ip, ix, last, i32([slot]), rot,
                                               backend="reference"))
        assert not torch.allclose(stale, outs[-1], atol=1e-2)
    assert torch.equal(outs[0], outs[1])
    # the rebuilt rows are the INT2 rows of the shared pages, in BF16
    k_int2, _ = gather_int2(cache, ix, n)
    assert torch.equal(cache.k_window[1, :8], k_int2[:8].to(torch.bfloat16))
    assert torch.equal(cache.k_window[1, 8 + (n - 1) % 24], k_int2[n - 1].to(torch.bfloat16))
    # and they stay within INT2 error of the exact rows
    exact = rotate(k[n - 1:n], rot.rot_k)[0]
    assert float((k_int2[n - 1] - exact).abs().max()) < float(exact.abs().max())
