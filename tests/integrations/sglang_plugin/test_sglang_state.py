"""oscar_kernels.integrations.sglang.state: the request-row bookkeeping of one process (no
SGLang needed)."""

from __future__ import annotations

import types

import pytest

from oscar_kernels import UnsupportedConfigError
from oscar_kernels.integrations.sglang.state import PluginState


def test_planned_rows_only_while_planning():
    state = PluginState()
    with pytest.raises(UnsupportedConfigError, match="max_running_requests"):
        state.planned_rows()
    with state.planning(4):
        assert state.planned_rows() == 4
        with state.planning(9):
            assert state.planned_rows() == 9
        assert state.planned_rows() == 4
    with pytest.raises(UnsupportedConfigError):
        state.planned_rows()


def test_fresh_rows_and_sink_keys():
    state = PluginState()
    state.mark_fresh_rows([3, 5])
    assert state.is_fresh(3) and state.is_fresh(5) and not state.is_fresh(4)
    state.clear_fresh([3, 4])
    assert not state.is_fresh(3) and state.is_fresh(5)
    state.set_row_sink_key(5, "k")
    assert state.row_sink_key(5) == "k" and state.row_sink_key(6) is None


def test_sink_entries_come_from_the_pool():
    state = PluginState()
    assert not state.has_sink_entry("k") and state.page_size == 1
    state.pool = types.SimpleNamespace(sink_index={"k": 0}, page_size=16)
    assert state.has_sink_entry("k") and not state.has_sink_entry("j")
    assert not state.has_sink_entry(None)
    assert state.page_size == 16
    # states are independent: one process's records never leak into another's
    assert not PluginState().has_sink_entry("k")
