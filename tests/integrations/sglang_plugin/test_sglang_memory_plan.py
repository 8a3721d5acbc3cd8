"""oscar_kernels.integrations.sglang.memory_plan, without SGLang.

Every byte the INT2 pool allocates is planned once: INT2 pages (``int2_pool_pages`` x
``int2_token_bytes``), one BF16 window slot per request row plus the padding row 0 and the
spare slots of CUDA-graph padding (``int2_window_slots`` x ``int2_window_slot_bytes``), and
the BF16 sink store (``int2_sink_store_bytes``). ``int2_memory_plan`` picks the largest
capacity whose cost fits the budget. The byte functions are checked against what
``Int2PagedKVCache.allocate`` allocates; the same plan through the real SGLang classes is in
test_sglang_hooks.py (skipped without sglang).
"""

from __future__ import annotations

import pytest
import torch

from oscar_kernels import CacheSpec, Int2PagedKVCache
from oscar_kernels.integrations.sglang import memory_plan as mp
from oscar_kernels.integrations.sglang.config import OscarConfig

# SGLang 0.5.23's default decode capture list for max_bs 256 (generate_decode_cuda_graph_
# batch_sizes: H100/H200 at TP < 4)
DEFAULT_DECODE_BS = [1, 2, 4, 8, 12] + list(range(16, 257, 8))


def _sglang_rows(tokens: int, *, context_len: int = 40960, requested: int | None = None) -> int:
    """KVCacheConfigurator.resolve_max_num_reqs of SGLang 0.5.23 (no mamba, DP 1)."""
    if requested is not None:
        return min(requested, tokens // 2)
    return min(max(min(int(tokens / context_len * 512), 4096), 2048), tokens // 2)


def _rows_fn(cfg, **kw):
    return lambda t: mp.int2_max_running_requests(t, _sglang_rows(t, **kw), cfg)


def _graph_fn(capture_bs, alignment=1):
    return lambda r: mp.int2_graph_max_bs(r, capture_bs=capture_bs, bs_alignment=alignment)


def _draw(gen, lo, hi):
    return int(torch.randint(lo, hi, (1,), generator=gen))


def test_byte_counts_match_the_allocation(gen):
    qwen = dict(num_kv_heads=8, head_dim=128, num_layers=36)
    cfg = OscarConfig()
    assert mp.int2_sink_store_bytes(**qwen, config=cfg) == 301_989_888
    assert mp.int2_window_slot_bytes(**qwen, config=cfg) == 47_185_920
    assert mp.int2_token_bytes(**qwen, config=cfg) == 20_736
    for _ in range(20):
        h, d, layers, entries = (_draw(gen, 1, 9), 2 ** _draw(gen, 4, 9), _draw(gen, 1, 81),
                                 _draw(gen, 0, 65))
        sink, recent, ps, tokens = (_draw(gen, 0, 129), _draw(gen, 0, 300),
                                    [1, 16, 64][_draw(gen, 0, 3)], _draw(gen, 0, 5000))
        slots = _draw(gen, 1, 40)
        cfg = OscarConfig(sink_entries=entries, sink_size=sink, recent_size=recent)
        dims = dict(num_kv_heads=h, head_dim=d, num_layers=layers, config=cfg)
        spec = CacheSpec(num_kv_heads=h, head_dim=d, page_size=ps, sink_size=sink,
                         recent_size=recent)
        pages = mp.int2_pool_pages(tokens, ps)
        cache = Int2PagedKVCache.allocate(spec, pages, slots, device="meta")
        page_nbytes = sum(t.nbytes for t in (cache.k_codes, cache.k_params, cache.v_codes,
                                             cache.v_params))
        assert page_nbytes * layers == pages * ps * mp.int2_token_bytes(**dims)
        assert (cache.k_window.nbytes + cache.v_window.nbytes) * layers == \
            slots * mp.int2_window_slot_bytes(**dims)
        # what OscarInt2TokenToKVPool allocates: a K and a V store per layer
        one = torch.empty((entries, sink, h, d), dtype=torch.bfloat16, device="meta")
        assert mp.int2_sink_store_bytes(**dims) == 2 * one.nbytes * layers
        # SGLang's token slots [0, tokens + page_size) all have a page
        assert pages * ps >= tokens + ps
    for cfg in (OscarConfig(sink_entries=0), OscarConfig(sink_size=0)):
        assert mp.int2_sink_store_bytes(**qwen, config=cfg) == 0
    with pytest.raises(ValueError, match="num_layers: expected a positive int, got 0"):
        mp.int2_sink_store_bytes(num_kv_heads=8, head_dim=128, num_layers=0,
                                     config=OscarConfig())
    for fn in (mp.int2_cell_size, mp.int2_token_bytes, mp.int2_window_slot_bytes):
        with pytest.raises(ValueError, match="num_layers: expected a positive int, got 0"):
            fn(num_kv_heads=8, head_dim=128, num_layers=0, config=OscarConfig())
    with pytest.raises(ValueError, match="page_size: expected a positive int, got 0"):
        mp.int2_pool_pages(10, 0)


def test_graph_max_bs_follows_sglang_capture_rule():
    assert mp.int2_graph_max_bs(5000, capture_bs=DEFAULT_DECODE_BS) == 256
    assert mp.int2_graph_max_bs(256, capture_bs=DEFAULT_DECODE_BS) == 256
    # fewer request rows than the list: SGLang adds the row count and drops what is beyond
    assert mp.int2_graph_max_bs(116, capture_bs=DEFAULT_DECODE_BS) == 116
    assert mp.int2_graph_max_bs(1, capture_bs=DEFAULT_DECODE_BS) == 1
    assert mp.int2_graph_max_bs(7, capture_bs=[1, 2, 4, 8]) == 7
    assert mp.int2_graph_max_bs(3, capture_bs=[1, 2]) == 2
    # alignment 2 (two-batch overlap): rows rounded up, odd sizes dropped
    assert mp.int2_graph_max_bs(7, capture_bs=[1, 2, 4, 8, 12], bs_alignment=2) == 8
    assert mp.int2_graph_max_bs(100, capture_bs=[1, 3, 5], bs_alignment=2) == 0
    assert mp.int2_graph_max_bs(100, capture_bs=[]) == 0
    assert mp.int2_window_slots(100, graph_max_bs=0) == 101
    assert mp.int2_window_slots(100, graph_max_bs=1) == 101
    assert mp.int2_window_slots(100, graph_max_bs=32) == 132
    with pytest.raises(ValueError, match="max_running_requests: expected a positive int, got 0"):
        mp.int2_graph_max_bs(0, capture_bs=[1])


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_plan_fits_and_one_more_page_does_not(gen, page_size):
    """Random budgets, sink/window settings, request-row policies and graph lists: the
    planned pool fits the budget and the next page would not."""
    for _ in range(12):
        cfg = OscarConfig(sink_entries=_draw(gen, 0, 65), sink_size=_draw(gen, 0, 129),
                                 recent_size=_draw(gen, 1, 513),
                                 tokens_per_request=_draw(gen, 64, 8192))
        dims = dict(num_kv_heads=[1, 2, 4, 8][_draw(gen, 0, 4)], head_dim=128,
                    num_layers=_draw(gen, 1, 81), config=cfg)
        graphs = [[], DEFAULT_DECODE_BS, [1, 2, 4, 8, 16, 32]][_draw(gen, 0, 3)]
        requested = [None, _draw(gen, 1, 300)][_draw(gen, 0, 2)]
        kw = dict(page_size=page_size, token_bytes=mp.int2_token_bytes(**dims),
                  window_slot_bytes=mp.int2_window_slot_bytes(**dims),
                  sink_store_bytes=mp.int2_sink_store_bytes(**dims),
                  max_running_requests=_rows_fn(cfg, requested=requested),
                  graph_max_bs=_graph_fn(graphs))
        budget = _draw(gen, 1 << 30, 1 << 37)
        plan = mp.int2_memory_plan(budget, config=cfg, **kw)
        t = plan.max_total_num_tokens
        assert t % page_size == 0 and t > 0
        assert plan.total_bytes <= budget
        nxt = mp.int2_memory_cost(t + page_size, **kw)
        assert nxt.total_bytes > budget, (plan, nxt, budget)
        # the plan counts what the pool allocates for its capacity
        rows = mp.int2_max_running_requests(t, _sglang_rows(t, requested=requested), cfg)
        assert plan.max_running_requests == rows
        assert plan.window_slots == rows + 1 + max(
            mp.int2_graph_max_bs(rows, capture_bs=graphs) - 1, 0)
        assert plan.page_bytes == mp.int2_pool_pages(t, page_size) * page_size \
            * kw["token_bytes"]


def test_plan_equals_exhaustive_search(gen):
    """Bisection finds the same capacity as trying every page (small budgets)."""
    cfg = OscarConfig(sink_size=4, recent_size=12, tokens_per_request=64,
                             sink_entries=3)
    dims = dict(num_kv_heads=2, head_dim=64, num_layers=3, config=cfg)
    for page_size in (1, 16):
        kw = dict(page_size=page_size, token_bytes=mp.int2_token_bytes(**dims),
                  window_slot_bytes=mp.int2_window_slot_bytes(**dims),
                  sink_store_bytes=mp.int2_sink_store_bytes(**dims),
                  max_running_requests=_rows_fn(cfg, context_len=512),
                  graph_max_bs=_graph_fn([1, 2, 4, 8, 12, 16]))
        for _ in range(10):
            budget = _draw(gen, 200_000, 3_000_000)
            best = max(p for p in range(1, budget // (page_size * kw["token_bytes"]) + 1)
                       if mp.int2_memory_cost(p * page_size, **kw).total_bytes <= budget)
            got = mp.int2_memory_plan(budget, config=cfg, **kw)
            assert got.max_total_num_tokens == best * page_size


def test_plan_too_small_names_the_flags():
    cfg = OscarConfig()
    dims = dict(num_kv_heads=8, head_dim=128, num_layers=36, config=cfg)
    kw = dict(page_size=16, token_bytes=mp.int2_token_bytes(**dims),
              window_slot_bytes=mp.int2_window_slot_bytes(**dims),
              sink_store_bytes=mp.int2_sink_store_bytes(**dims),
              max_running_requests=_rows_fn(cfg), graph_max_bs=_graph_fn(DEFAULT_DECODE_BS))
    one = mp.int2_memory_cost(16, **kw)
    # one page: 3 pages allocated (int2_pool_pages), 1 request row + padding row, no spare
    assert (one.num_pages, one.window_slots, one.graph_max_bs) == (3, 2, 1)
    assert one.total_bytes == 3 * 16 * 20_736 + 2 * 47_185_920 + 301_989_888
    assert mp.int2_memory_plan(one.total_bytes, config=cfg, **kw).max_total_num_tokens == 16
    with pytest.raises(ValueError, match=r"one page of tokens \(995,328 B.*2 BF16 window slots "
                                         r"\(94,371,840 B.*--oscar-sink-size 64.*"
                                         r"--cuda-graph-max-bs-decode.*"
                                         r"--oscar-sink-cache-entries 32.*397,357,056 B in all; "
                                         r"got a budget of 397,357,055 B"):
        mp.int2_memory_plan(one.total_bytes - 1, config=cfg, **kw)
    with pytest.raises(ValueError, match="available_bytes: expected an int >= 0, got -1"):
        mp.int2_memory_plan(-1, config=cfg, **kw)
    with pytest.raises(ValueError, match="token_bytes: expected an int >= 1, got 0"):
        mp.int2_memory_plan(1 << 30, config=cfg, **{**kw, "token_bytes": 0})


def _qwen3_8b_plan(gib: int, capture_bs, *, num_kv_heads: int = 8, page_size: int = 1):
    cfg = OscarConfig()
    dims = dict(num_kv_heads=num_kv_heads, head_dim=128, num_layers=36, config=cfg)
    return mp.int2_memory_plan(
        gib << 30, page_size=page_size, token_bytes=mp.int2_token_bytes(**dims),
        window_slot_bytes=mp.int2_window_slot_bytes(**dims),
        sink_store_bytes=mp.int2_sink_store_bytes(**dims),
        max_running_requests=_rows_fn(cfg), graph_max_bs=_graph_fn(capture_bs), config=cfg)


def test_qwen3_8b_numbers_in_docs():
    """The Qwen3-8B TP1 figures quoted in docs/integrations.md section 2.1 (defaults:
    S 64, W 256, 32 sink entries, 2048 tokens per request, page size 1)."""
    got = {}
    for gib in (10, 100):
        for name, bs in (("default", DEFAULT_DECODE_BS), ("bs32", DEFAULT_DECODE_BS[:8]),
                         ("off", [])):
            p = _qwen3_8b_plan(gib, bs)
            got[gib, name] = (p.max_total_num_tokens, p.max_running_requests, p.graph_max_bs,
                              p.window_slots)
    assert DEFAULT_DECODE_BS[:8] == [1, 2, 4, 8, 12, 16, 24, 32]
    assert got == {
        (10, "default"): (157_365, 76, 76, 152),
        (10, "bs32"): (204_799, 99, 32, 131),
        (10, "off"): (237_567, 115, 0, 116),
        (100, "default"): (2_170_879, 1_059, 256, 1_315),
        (100, "bs32"): (2_412_440, 1_177, 32, 1_209),
        (100, "off"): (2_445_311, 1_193, 0, 1_194),
    }
    p = _qwen3_8b_plan(10, DEFAULT_DECODE_BS)
    assert (p.page_bytes, p.window_bytes, p.total_bytes) == \
        (3_263_162_112, 7_172_259_840, 10_737_411_840)
    # TP rank of 2: 4 KV heads, half of every byte count per token / slot / store
    p = _qwen3_8b_plan(10, DEFAULT_DECODE_BS, num_kv_heads=4)
    assert p.sink_store_bytes == 150_994_944


def test_cell_size_rule_of_thumb():
    cfg = OscarConfig(sink_size=64, recent_size=256, tokens_per_request=2048)
    # Qwen3-8B at TP1: INT2 pages 576 B/token/layer + a 320-row BF16 window (4096 B/row/layer)
    # amortized over 2048 tokens per request = 640 B
    cell = mp.int2_cell_size(num_kv_heads=8, head_dim=128, num_layers=36, config=cfg)
    assert cell == 36 * (576 + 640)
    assert cell < 36 * 4096  # what SGLang would budget for BF16
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=1)
    tokens = 10 ** 6
    rows = mp.int2_max_running_requests(tokens, 4096, cfg)
    assert rows == tokens // 2048
    used = tokens * spec.int2_bytes_per_token * 36 + rows * spec.window_size * \
        spec.bf16_bytes_per_token * 36
    assert used <= tokens * cell  # pages + windows fit the budget SGLang was told about
    assert mp.int2_max_running_requests(tokens, 100, cfg) == 100
    env = {}
    cfg.to_env(env)
    assert OscarConfig.from_env(env).tokens_per_request == 2048
