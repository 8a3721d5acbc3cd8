"""The SGLang plugin's memory plan for the BF16 sink store, without SGLang.

``int2_sink_store_bytes`` must equal what the pool allocates (``sink_entries`` x
``sink_size`` BF16 K+V rows per layer), and ``int2_kv_budget`` takes exactly those bytes out
of SGLang's KV budget before SGLang divides it by the cell size. The same plan through the
real SGLang classes is in test_sglang_plugin.py (skipped without sglang).
"""

from __future__ import annotations

import pytest
import torch

from oscar_kernels.integrations import sglang as plugin


def _sglang_capacity(budget: int, cell: int, page_size: int) -> int:
    """What ``DefaultPoolConfigurator.calculate_pool_sizes`` does with a budget (0.5.23)."""
    return budget // cell // page_size * page_size


def test_sink_store_bytes_match_the_pool_allocation(gen):
    # Qwen3-8B at TP1 with the defaults: 32 entries x 64 sink rows x 36 layers x 4,096 B
    qwen = dict(num_kv_heads=8, head_dim=128, num_layers=36)
    assert plugin.int2_sink_store_bytes(**qwen, config=plugin.OscarConfig()) == 301_989_888
    for _ in range(20):
        h, d, layers, entries, sink = (int(torch.randint(lo, hi, (1,), generator=gen))
                                       for lo, hi in ((1, 9), (16, 257), (1, 81), (0, 65),
                                                      (0, 129)))
        cfg = plugin.OscarConfig(sink_entries=entries, sink_size=sink)
        # what OscarInt2TokenToKVPool allocates: a K and a V store per layer
        one = torch.empty((entries, sink, h, d), dtype=torch.bfloat16)
        want = 2 * one.nbytes * layers
        got = plugin.int2_sink_store_bytes(num_kv_heads=h, head_dim=d, num_layers=layers,
                                           config=cfg)
        assert got == want, (h, d, layers, entries, sink)
    for cfg in (plugin.OscarConfig(sink_entries=0), plugin.OscarConfig(sink_size=0)):
        assert plugin.int2_sink_store_bytes(**qwen, config=cfg) == 0
    with pytest.raises(ValueError, match="num_layers: expected a positive int, got 0"):
        plugin.int2_sink_store_bytes(num_kv_heads=8, head_dim=128, num_layers=0,
                                     config=plugin.OscarConfig())


def test_kv_budget_takes_the_sink_store_out_once(gen):
    cfg = plugin.OscarConfig()
    dims = dict(num_kv_heads=8, head_dim=128, num_layers=36, config=cfg)
    cell = plugin.int2_cell_size(**dims)
    sink = plugin.int2_sink_store_bytes(**dims)
    for page_size in (1, 16, 64):
        for _ in range(10):
            budget = int(torch.randint(1 << 29, 1 << 37, (1,), generator=gen))
            left = plugin.int2_kv_budget(budget, sink_store_bytes=sink, cell_size=cell,
                                         page_size=page_size, config=cfg)
            assert left == budget - sink
            tokens = _sglang_capacity(left, cell, page_size)
            # pages + amortized windows of the planned tokens, plus the store, fit the budget
            assert tokens * cell + sink <= budget
            # and no further page would have fit beside the store
            assert (tokens + page_size) * cell + sink > budget
            # without a store the budget is untouched: the plan before the store existed
            assert plugin.int2_kv_budget(budget, sink_store_bytes=0, cell_size=cell,
                                         page_size=page_size, config=cfg) == budget


def test_kv_budget_too_small_for_the_sink_store():
    cfg = plugin.OscarConfig()
    dims = dict(num_kv_heads=8, head_dim=128, num_layers=36, config=cfg)
    cell = plugin.int2_cell_size(**dims)
    sink = plugin.int2_sink_store_bytes(**dims)
    kw = dict(sink_store_bytes=sink, cell_size=cell, page_size=16, config=cfg)
    need = sink + 16 * cell
    assert _sglang_capacity(plugin.int2_kv_budget(need, **kw), cell, 16) == 16  # one page
    with pytest.raises(ValueError, match=r"--oscar-sink-cache-entries 32: .*301,989,888 B"
                                         r".*700,416 B.*302,690,304 B.*302,690,303 B"):
        plugin.int2_kv_budget(need - 1, **kw)
    with pytest.raises(ValueError, match="budget of 0 B"):
        plugin.int2_kv_budget(0, **kw)
    with pytest.raises(ValueError, match="available_bytes: expected an int >= 0, got -1"):
        plugin.int2_kv_budget(-1, **kw)
    with pytest.raises(ValueError, match="cell_size: expected an int >= 1, got 0"):
        plugin.int2_kv_budget(1 << 30, sink_store_bytes=sink, cell_size=0, page_size=1,
                              config=cfg)


def test_sink_cache_entries_zero_is_valid():
    plugin.OscarConfig(sink_entries=0).validate()
    env = {}
    plugin.OscarConfig(sink_entries=0).to_env(env)
    assert plugin.OscarConfig.from_env(env).sink_entries == 0
    with pytest.raises(ValueError, match="--oscar-sink-cache-entries: expected a non-negative "
                                         "int .*got -1"):
        plugin.OscarConfig(sink_entries=-1).validate()


def test_qwen3_8b_numbers_in_docs():
    """The Qwen3-8B TP1 figures quoted in docs/integrations.md section 2.1."""
    cfg = plugin.OscarConfig()
    dims = dict(num_kv_heads=8, head_dim=128, num_layers=36, config=cfg)
    cell = plugin.int2_cell_size(**dims)
    sink = plugin.int2_sink_store_bytes(**dims)
    assert plugin.int2_sink_store_bytes(**{**dims, "num_kv_heads": 4}) == 150_994_944
    got = {}
    for gib in (10, 100):
        budget = gib << 30
        left = plugin.int2_kv_budget(budget, sink_store_bytes=sink, cell_size=cell, page_size=1,
                                     config=cfg)
        tokens = _sglang_capacity(left, cell, 1)
        sglang_reqs = min(max(min(int(tokens / 40960 * 512), 4096), 2048), tokens // 2)
        got[gib] = (tokens, _sglang_capacity(budget, cell, 1),
                    plugin.int2_max_running_requests(tokens, sglang_reqs, cfg))
    assert got == {10: (238_382, 245_280, 116), 100: (2_445_910, 2_452_809, 1_194)}
