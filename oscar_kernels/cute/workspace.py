"""Zeroed ticket buffers for the decode kernel's last-CTA split merge.

One int32 ticket per (sequence, KV head); every launch leaves them zero again. Eager calls
share one buffer per (device, stream); a call captured into a CUDA graph gets a slice of its
own from an arena zeroed ahead of time. Replaced buffers are kept alive (a captured graph
may hold their addresses).
"""

from __future__ import annotations

import threading

from .config import TRACE_TICKET_WORDS

_COUNTERS: dict = {}
_COUNTERS_LOCK = threading.Lock()
#: device index -> zeroed ticket buffers kept for streams first seen while a CUDA graph is
#: being captured on them (so the graph does not get a memset node of its own buffer)
_SPARES: dict = {}
#: replaced ticket buffers: a captured graph keeps their addresses, so they are never freed
_RETIRED: list = []
#: spare ticket buffers kept per device
SPARE_TICKET_BUFFERS = 2
#: int32 words per arena of zeroed tickets for calls captured into CUDA graphs (4 MB)
CAPTURE_ARENA_WORDS = 1 << 20
#: device index -> [zeroed int32 arena, next free word]; each captured call takes its own
#: slice, so no two graphs (nor a graph and eager calls) ever share tickets
_ARENAS: dict = {}


def _counters(dev, n: int, trace: bool = False):
    """Zeroed int32 tickets, one per (sequence, KV head), for the kernel's last-CTA merge.

    Every launch leaves them zero again (the last CTA resets its ticket). Eager calls: one
    buffer per (device, stream) serves every call on that stream; calls that may run
    concurrently must be on different streams. A call captured into a CUDA graph gets
    tickets of its own (:func:`_capture_tickets`), so graphs replayed concurrently on
    different streams, or next to eager calls on the stream they were captured on, never
    share them (a shared ticket would merge another call's partials, or leave a merge CTA
    waiting for counts that never come).

    A buffer that is replaced by a larger one is kept alive, since a graph may hold its
    address. (``trace``, for debug trace builds: room for the trace stamps after the tickets,
    and one buffer per stream for captures too, where perf/trace_decode.py reads the stamps:
    a stream first seen while a graph is being captured takes a spare buffer zeroed ahead
    of time, since a ``torch.zeros`` there would put a memset node into the graph.)
    """
    import torch

    key = (dev.index if dev.index is not None else torch.cuda.current_device(),
           torch.cuda.current_stream(dev).cuda_stream)
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing and not trace:
        return _capture_tickets(dev, key[0], n)
    with _COUNTERS_LOCK:
        if key[0] not in _ARENAS and not capturing:
            # zeroed ahead of the first capture (a torch.zeros while capturing would put a
            # memset node into that graph)
            _ARENAS[key[0]] = [torch.zeros(CAPTURE_ARENA_WORDS, dtype=torch.int32,
                                           device=dev), 0]
        buf = _COUNTERS.get(key)
        if buf is None or buf.numel() < n:
            size = max(n, 4096)
            if trace:   # debug trace builds: 128 B per CTA
                size = TRACE_TICKET_WORDS
            spares = _SPARES.setdefault(key[0], [])
            fit = [t for t in spares if t.numel() >= size]
            if capturing and fit:
                new = fit[0]
                spares.remove(new)
            else:
                new = torch.zeros(size, dtype=torch.int32, device=dev)
                if not capturing:
                    spares[:] = [t for t in spares if t.numel() >= size]
                    spares.extend(torch.zeros(size, dtype=torch.int32, device=dev)
                                  for _ in range(SPARE_TICKET_BUFFERS - len(spares)))
            if buf is not None:
                _RETIRED.append(buf)
            buf = _COUNTERS[key] = new
    return buf


def _capture_tickets(dev, index: int, n: int):
    """A zeroed slice of ``n`` tickets (128-byte aligned) for one call being captured into a
    CUDA graph, never handed out again: the arena of device ``index`` zeroed ahead of time
    by the first eager call (:func:`_counters`), or a new one zeroed here when it is used
    up or missing (a memset node in the graph being captured; the old arena is kept alive,
    graphs hold its addresses)."""
    import torch

    need = -(-max(n, 1) // 32) * 32
    with _COUNTERS_LOCK:
        arena = _ARENAS.get(index)
        if arena is None or arena[1] + need > arena[0].numel():
            if arena is not None:
                _RETIRED.append(arena[0])
            arena = _ARENAS[index] = [torch.zeros(max(CAPTURE_ARENA_WORDS, need),
                                                  dtype=torch.int32, device=dev), 0]
        start = arena[1]
        arena[1] = start + need
        return arena[0][start:start + n]
