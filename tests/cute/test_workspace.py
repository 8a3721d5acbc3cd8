"""Ticket buffers (:mod:`oscar_kernels.cute.workspace`): per stream for eager calls, a
private zeroed slice per captured call, room for the trace stamps of debug builds."""

from __future__ import annotations

import torch

from oscar_kernels.cute import config, workspace


def _ticket_state(monkeypatch):
    """_counters' view of torch.cuda, driven by the returned dict (stream, capturing)."""
    state = {"stream": 1, "capturing": False}

    class S:
        def __init__(self, v):
            self.cuda_stream = v
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: S(state["stream"]))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        lambda: state["capturing"])
    for name in ("_COUNTERS", "_SPARES", "_ARENAS"):
        monkeypatch.setattr(workspace, name, {})
    monkeypatch.setattr(workspace, "_RETIRED", [])
    return state


def test_ticket_buffers_per_stream_and_private_per_captured_call(monkeypatch):
    """_counters: eager calls share their stream's zeroed buffer (and zero a capture arena
    ahead of time); every call captured into a graph gets its own zeroed, 128-byte aligned
    slice, never handed out again, whatever the stream; a used-up arena is replaced (a new
    zeroed one) and kept alive, as is a replaced stream buffer (graphs hold addresses)."""
    state = _ticket_state(monkeypatch)
    monkeypatch.setattr(workspace, "CAPTURE_ARENA_WORDS", 512)
    dev = torch.device("cpu", 0)
    a = workspace._counters(dev, 100)
    assert a.numel() == 4096 and int(a.abs().sum()) == 0
    assert workspace._counters(dev, 100) is a                       # one buffer per stream
    arena = workspace._ARENAS[0][0]
    assert arena.numel() == 512 and int(arena.abs().sum()) == 0
    state.update(capturing=True)                               # captured on the same stream
    b = workspace._counters(dev, 100)
    c = workspace._counters(dev, 300)
    state.update(stream=2)                                     # ... and on another
    d = workspace._counters(dev, 1)
    slices = [b, c, d]
    assert [t.numel() for t in slices] == [100, 300, 1]
    starts = [(t.data_ptr() - arena.data_ptr()) // 4 for t in slices]
    assert starts == [0, 128, 448]                             # disjoint, 32-word aligned
    assert all(t.untyped_storage().data_ptr() == arena.data_ptr() for t in slices)
    assert all(int(t.abs().sum()) == 0 for t in slices) and a.data_ptr() != b.data_ptr()
    e = workspace._counters(dev, 100)                               # 480 + 128 > 512: new arena
    assert e.data_ptr() == workspace._ARENAS[0][0].data_ptr() != arena.data_ptr()
    assert any(t is arena for t in workspace._RETIRED) and int(e.abs().sum()) == 0
    huge = workspace._counters(dev, 5000)                           # larger than an arena
    assert huge.numel() == 5000 and int(huge.abs().sum()) == 0
    state.update(stream=1, capturing=False)                    # larger: old one retired
    big = workspace._counters(dev, 5000)
    assert big.numel() == 5000 and any(a is t for t in workspace._RETIRED)


def test_ticket_buffers_trace_builds_keep_one_per_stream(monkeypatch):
    """For debug trace builds (``trace``, perf/trace_decode.py) captured calls use their
    stream's buffer: a stream first seen while capturing takes a spare zeroed ahead (no
    fill inside the graph)."""
    state = _ticket_state(monkeypatch)
    dev = torch.device("cpu", 0)
    a = workspace._counters(dev, 100, trace=True)
    assert a.numel() == config.TRACE_OFFSET // 4 + (1 << 22) and int(a.abs().sum()) == 0
    spares = list(workspace._SPARES[0])
    assert len(spares) == workspace.SPARE_TICKET_BUFFERS
    state.update(stream=2, capturing=True)                     # a fresh capture stream
    b = workspace._counters(dev, 100, trace=True)
    assert any(b is t for t in spares) and not any(b is t for t in workspace._SPARES[0])
    assert workspace._counters(dev, 100, trace=True) is b           # that stream's buffer now
