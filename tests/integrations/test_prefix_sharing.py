"""Prefix sharing at the op level (CPU, reference backend): two requests sharing a
1,000-token prefix, the second reusing the first's INT2 pages and getting its own window slot
rebuilt from real K/V (docs/format.md section 5), give the same attention outputs as two
independent requests, and the shared pages keep their bytes."""

from __future__ import annotations

import torch

from helpers import i32, poisoned_cache, random_rotation
from oscar_kernels import CacheSpec, ops
from oscar_kernels.page import get_batch_indices_positions

PREFIX, SUFFIX = 1000, 37
HEADS, GQA, D, PAGE = 2, 4, 64, 16


def _table(page_ids, length):
    n = -(-length // PAGE)
    return i32([0, n]), i32(page_ids[:n]), i32([(length - 1) % PAGE + 1])


def _extend(cache, q, k, v, page_ids, start, length, slot, rot):
    """Append tokens [start, length) of one sequence and attend with their queries."""
    ip, ix, last = _table(page_ids, length)
    return ops.paged_extend_attention(q, k, v, i32([0, length - start]), cache, ip, ix, last,
                                      i32([slot]), rot, backend="reference")


def test_shared_prefix_equals_independent_requests(gen):
    spec = CacheSpec(num_kv_heads=HEADS, head_dim=D, page_size=PAGE, sink_size=64,
                     recent_size=256)
    rot = random_rotation(HEADS, D, gen)
    total = PREFIX + SUFFIX
    k_pre = torch.randn(PREFIX, HEADS, D, generator=gen).to(torch.bfloat16)
    v_pre = torch.randn(PREFIX, HEADS, D, generator=gen).to(torch.bfloat16)
    q_pre = torch.randn(PREFIX, HEADS * GQA, D, generator=gen).to(torch.bfloat16)
    sfx = [tuple(torch.randn(SUFFIX, h, D, generator=gen).to(torch.bfloat16)
                 for h in (HEADS * GQA, HEADS, HEADS)) for _ in range(2)]
    pages_pre = -(-PREFIX // PAGE)  # 63 pages, the last one partial (1000 = 62 * 16 + 8)
    pages_all = -(-total // PAGE)

    # independent: each request has its own pages and its own slot
    indep = poisoned_cache(spec, 2 * pages_all + 2, 4)
    want = []
    for r in range(2):
        ids = list(range(r * pages_all, (r + 1) * pages_all))
        _extend(indep, q_pre, k_pre, v_pre, ids, 0, PREFIX, 2 * r, rot)
        q_s, k_s, v_s = sfx[r]
        want.append(_extend(indep, q_s, k_s, v_s, ids, PREFIX, total, 2 * r, rot))

    # shared: request 0 writes the prefix; request 1 reuses its full pages (the partial last
    # page is copied-on-write, as a radix cache with page_size > 1 would: whole pages only)
    shared = poisoned_cache(spec, 2 * pages_all + 2, 4)
    ids0 = list(range(pages_all))
    _extend(shared, q_pre, k_pre, v_pre, ids0, 0, PREFIX, 0, rot)
    reuse = (PREFIX // PAGE) * PAGE  # 992 tokens in full pages
    ids1 = ids0[: reuse // PAGE] + list(range(pages_all, pages_all + pages_all - reuse // PAGE))
    # slot 3 last held an unrelated request: poison it with finite garbage (stale rows)
    shared.k_window[3] = torch.randn(shared.k_window.shape[1:], generator=gen).to(torch.bfloat16)
    shared.v_window[3] = torch.randn(shared.v_window.shape[1:], generator=gen).to(torch.bfloat16)
    pages_before = {n: t.clone() for n, t in shared.tensors().items() if "window" not in n}
    # rebuild request 1's window from real K/V: sink rows + recent rows of the reused part
    ip, ix, last = _table(ids1, reuse)
    keep = [p for p in range(reuse) if p < spec.sink_size or p >= reuse - spec.recent_size]
    b, p = get_batch_indices_positions(i32([0, len(keep)]), i32([reuse]), len(keep))
    p = i32(keep)
    kk, vv = k_pre[keep], v_pre[keep]
    ops.quantize_append_paged_kv_cache(kk, vv, b, p, shared, ix, ip, last, i32([3]), rot,
                                       backend="reference")
    for n, t in pages_before.items():  # shared pages unchanged, byte for byte
        assert torch.equal(t.view(torch.uint8), shared.tensors()[n].view(torch.uint8)), n
    # request 1: the rest of the prefix (copy-on-write page) and its suffix in one extend
    q1, k1, v1 = sfx[1]
    tail = slice(reuse, PREFIX)
    got1 = _extend(shared, torch.cat([q_pre[tail], q1]), torch.cat([k_pre[tail], k1]),
                   torch.cat([v_pre[tail], v1]), ids1, reuse, total, 3, rot)[PREFIX - reuse:]
    # request 0 continues with its own suffix on the original pages
    q0, k0, v0 = sfx[0]
    got0 = _extend(shared, q0, k0, v0, ids0, PREFIX, total, 0, rot)
    assert torch.equal(got0, want[0])
    assert torch.equal(got1, want[1])
    # the two requests' pages of the shared prefix hold identical bytes
    for name in ("k_codes", "k_params", "v_codes", "v_params"):
        t = getattr(shared, name)
        assert torch.equal(t[: reuse // PAGE].view(torch.uint8),
                           getattr(indep, name)[pages_all: pages_all + reuse // PAGE]
                           .view(torch.uint8))
