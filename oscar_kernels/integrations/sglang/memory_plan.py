"""The INT2 pool's memory plan: every byte the pool allocates, counted once, and the
largest token capacity whose pool fits SGLang's KV budget.

SGLang profiles a KV byte budget and turns it into a token capacity, then derives the
request rows from the capacity and, later, the largest decode CUDA-graph batch from the
rows. Under ``int2`` the pool holds INT2 pages (:func:`int2_pool_pages` x
:func:`int2_token_bytes`), one BF16 window slot per request row plus the padding row and the
spares of CUDA-graph padding (:func:`int2_window_slots` x :func:`int2_window_slot_bytes`),
and the BF16 sink store (:func:`int2_sink_store_bytes`); :func:`int2_memory_plan` picks the
largest capacity whose cost (:func:`int2_memory_cost`) fits. Plain arithmetic: no SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import expect
from ...spec import CacheSpec
from .config import OscarConfig


def _check_dims(**dims) -> None:
    for name, val in dims.items():
        expect(isinstance(val, int) and val >= 1, name, "a positive int", val)


def _spec(num_kv_heads: int, head_dim: int, config: OscarConfig) -> CacheSpec:
    return CacheSpec(num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=1,
                     group_size=config.group_size, sink_size=config.sink_size,
                     recent_size=config.recent_size)


def int2_cell_size(*, num_kv_heads: int, head_dim: int, num_layers: int,
                   config: OscarConfig) -> int:
    """Average bytes per token of KV capacity when requests average
    ``config.tokens_per_request`` tokens: INT2 pages plus one BF16 window slot of
    ``sink_size + recent_size`` rows per request row, spread over its tokens.

    A rule of thumb for sizing; the plan itself (:func:`int2_memory_plan`) counts the
    window slots the pool allocates, not an average.

    Example
    -------
    >>> int2_cell_size(num_kv_heads=8, head_dim=128, num_layers=36, config=OscarConfig())
    43776
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    spec = _spec(num_kv_heads, head_dim, config)
    window_row = spec.window_size * spec.bf16_bytes_per_token
    per_token = spec.int2_bytes_per_token + -(-window_row // config.tokens_per_request)
    return per_token * num_layers


def int2_token_bytes(*, num_kv_heads: int, head_dim: int, num_layers: int,
                     config: OscarConfig) -> int:
    """INT2 page bytes of one token of KV capacity, all layers (SGLang's cell size under
    ``int2``): codes and scale/zero parameters of K and V.

    Example
    -------
    >>> int2_token_bytes(num_kv_heads=8, head_dim=128, num_layers=36, config=OscarConfig())
    20736
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    return _spec(num_kv_heads, head_dim, config).int2_bytes_per_token * num_layers


def int2_window_slot_bytes(*, num_kv_heads: int, head_dim: int, num_layers: int,
                           config: OscarConfig) -> int:
    """Bytes of one BF16 window slot, all layers: ``sink_size + recent_size`` K and V rows.

    Example
    -------
    >>> int2_window_slot_bytes(num_kv_heads=8, head_dim=128, num_layers=36,
    ...                        config=OscarConfig())
    47185920
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    spec = _spec(num_kv_heads, head_dim, config)
    return spec.window_size * spec.bf16_bytes_per_token * num_layers


def int2_pool_pages(max_total_num_tokens: int, page_size: int) -> int:
    """Pages :class:`~oscar_kernels.integrations.sglang.pool.OscarInt2TokenToKVPool`
    allocates for SGLang's ``max_total_num_tokens`` token slots (slot ``s`` is page
    ``s // page_size``; SGLang's slots run to ``max_total_num_tokens + page_size``).

    Example
    -------
    >>> int2_pool_pages(1000, 16)
    64
    """
    expect(isinstance(max_total_num_tokens, int) and max_total_num_tokens >= 0,
           "max_total_num_tokens", "an int >= 0", max_total_num_tokens)
    expect(isinstance(page_size, int) and page_size >= 1, "page_size", "a positive int",
           page_size)
    return (max_total_num_tokens + page_size) // page_size + 1


def int2_graph_max_bs(max_running_requests: int, *, capture_bs, bs_alignment: int = 1) -> int:
    """Largest decode batch SGLang 0.5.23 captures a CUDA graph for (0: none captured).

    ``get_batch_sizes_to_capture`` (decode runner) takes the ``--cuda-graph-bs-decode``
    list (``cuda_graph_config.decode.bs``), adds ``ceil(max_running_requests /
    bs_alignment) * bs_alignment`` when the list goes beyond it, and keeps the sizes that
    are multiples of ``bs_alignment`` and not beyond that bound. ``init_cuda_graph_state``
    is called with the largest.

    Parameters
    ----------
    max_running_requests : int
        ``ReqToTokenPool.size`` (request rows, without the padding row 0).
    capture_bs : sequence of int
        The decode capture list; empty when decode graphs are off.
    bs_alignment : int
        ``get_cuda_graph_batch_size_alignment`` (1 without TBO / gathered buffers).

    Example
    -------
    >>> int2_graph_max_bs(116, capture_bs=[1, 2, 4, 8, 12, 16, 24, 256])
    116
    >>> int2_graph_max_bs(1194, capture_bs=[1, 2, 4, 8, 12, 16, 24, 256])
    256
    """
    expect(isinstance(max_running_requests, int) and max_running_requests >= 1,
           "max_running_requests", "a positive int", max_running_requests)
    expect(isinstance(bs_alignment, int) and bs_alignment >= 1, "bs_alignment",
           "a positive int", bs_alignment)
    bs = [int(b) for b in capture_bs or ()]
    if not bs:
        return 0
    limit = -(-max_running_requests // bs_alignment) * bs_alignment
    if max(bs) > limit:
        bs.append(limit)
    bs = [b for b in bs if b % bs_alignment == 0 and 0 < b <= limit]
    return max(bs) if bs else 0


def int2_window_slots(max_running_requests: int, *, graph_max_bs: int) -> int:
    """Window slots the pool allocates: one per SGLang request row (``max_running_requests``
    rows plus the padding row 0) and ``graph_max_bs - 1`` spares.

    A CUDA-graph batch padded to ``bs`` entries repeats the padding row 0 (at capture:
    ``bs`` times); each entry needs its own slot (the ops take distinct slots), so the
    repeats take spare slots after the request rows: at most ``graph_max_bs - 1``.

    Example
    -------
    >>> int2_window_slots(100, graph_max_bs=32)
    132
    >>> int2_window_slots(100, graph_max_bs=0)
    101
    """
    expect(isinstance(max_running_requests, int) and max_running_requests >= 1,
           "max_running_requests", "a positive int", max_running_requests)
    expect(isinstance(graph_max_bs, int) and graph_max_bs >= 0, "graph_max_bs",
           "an int >= 0", graph_max_bs)
    return max_running_requests + 1 + max(graph_max_bs - 1, 0)


@dataclass(frozen=True)
class Int2MemoryPlan:
    """What the INT2 pool allocates for a token capacity (bytes, all local layers)."""

    max_total_num_tokens: int
    page_size: int
    num_pages: int
    max_running_requests: int
    graph_max_bs: int
    window_slots: int
    page_bytes: int
    window_bytes: int
    sink_store_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.page_bytes + self.window_bytes + self.sink_store_bytes


def int2_memory_cost(max_total_num_tokens: int, *, page_size: int, token_bytes: int,
                     window_slot_bytes: int, sink_store_bytes: int, max_running_requests,
                     graph_max_bs) -> Int2MemoryPlan:
    """The bytes the INT2 pool allocates for ``max_total_num_tokens`` token slots.

    Parameters
    ----------
    max_total_num_tokens, page_size : int
    token_bytes : int
        :func:`int2_token_bytes`.
    window_slot_bytes : int
        :func:`int2_window_slot_bytes`.
    sink_store_bytes : int
        :func:`int2_sink_store_bytes`.
    max_running_requests : callable ``int -> int``
        Request rows SGLang gives this capacity (``resolve_max_num_reqs`` with the INT2
        cap); non-decreasing.
    graph_max_bs : callable ``int -> int``
        Largest captured decode batch for that many request rows (:func:`int2_graph_max_bs`;
        0 without decode graphs); non-decreasing.

    Returns
    -------
    Int2MemoryPlan
        ``page_bytes = int2_pool_pages(...) * page_size * token_bytes``, ``window_bytes =
        int2_window_slots(...) * window_slot_bytes``, the sink store.
    """
    rows = max(1, int(max_running_requests(max_total_num_tokens)))
    gbs = int(graph_max_bs(rows))
    pages = int2_pool_pages(max_total_num_tokens, page_size)
    slots = int2_window_slots(rows, graph_max_bs=gbs)
    return Int2MemoryPlan(max_total_num_tokens=max_total_num_tokens, page_size=page_size,
                          num_pages=pages, max_running_requests=rows, graph_max_bs=gbs,
                          window_slots=slots, page_bytes=pages * page_size * token_bytes,
                          window_bytes=slots * window_slot_bytes,
                          sink_store_bytes=sink_store_bytes)


def int2_memory_plan(available_bytes: int, *, page_size: int, token_bytes: int,
                     window_slot_bytes: int, sink_store_bytes: int, max_running_requests,
                     graph_max_bs, config: OscarConfig) -> Int2MemoryPlan:
    """The largest token capacity (whole pages) whose INT2 pool fits SGLang's KV budget.

    Everything the pool and the attention backend allocate is counted once
    (:func:`int2_memory_cost`): INT2 pages, one BF16 window slot per request row (the rows
    SGLang derives from the capacity, plus its padding row 0), the spare slots of
    CUDA-graph padding (the largest captured decode batch, which SGLang also derives from
    the request rows), and the BF16 sink store. The cost grows with the capacity, so the
    largest capacity that fits is found by bisection over pages.

    Parameters
    ----------
    available_bytes : int
        SGLang's KV budget (``_profile_available_bytes``).
    page_size, token_bytes, window_slot_bytes, sink_store_bytes, max_running_requests,
    graph_max_bs
        As :func:`int2_memory_cost`.
    config : OscarConfig
        Named in the error message.

    Returns
    -------
    Int2MemoryPlan
        ``total_bytes <= available_bytes``; one more page would not fit.

    Raises
    ------
    ValueError
        Not even one page of tokens fits; the message names the flags and byte counts.

    Example
    -------
    >>> plan = int2_memory_plan(10 << 30, page_size=1, token_bytes=20736,
    ...                         window_slot_bytes=47185920, sink_store_bytes=301989888,
    ...                         max_running_requests=lambda t: t // 2048,
    ...                         graph_max_bs=lambda r: 0, config=OscarConfig())
    >>> plan.max_total_num_tokens, plan.window_slots
    (237567, 116)
    """
    for name, val, low in (("available_bytes", available_bytes, 0), ("page_size", page_size, 1),
                           ("token_bytes", token_bytes, 1),
                           ("window_slot_bytes", window_slot_bytes, 0),
                           ("sink_store_bytes", sink_store_bytes, 0)):
        expect(isinstance(val, int) and val >= low, name, f"an int >= {low}", val)

    def cost(pages: int) -> Int2MemoryPlan:
        return int2_memory_cost(pages * page_size, page_size=page_size,
                                token_bytes=token_bytes, window_slot_bytes=window_slot_bytes,
                                sink_store_bytes=sink_store_bytes,
                                max_running_requests=max_running_requests,
                                graph_max_bs=graph_max_bs)

    one = cost(1)
    if one.total_bytes > available_bytes:
        raise ValueError(
            f"--kv-cache-dtype int2: expected SGLang's KV budget to hold one page of tokens "
            f"({one.page_bytes:,} B of INT2 pages), {one.window_slots} BF16 window slots "
            f"({one.window_bytes:,} B: --oscar-sink-size {config.sink_size} + "
            f"--oscar-recent-size {config.recent_size} rows each; "
            f"{max(one.graph_max_bs - 1, 0)} of them spares for decode CUDA graphs up to "
            f"batch {one.graph_max_bs}, --cuda-graph-max-bs-decode) and the sink store "
            f"({one.sink_store_bytes:,} B, --oscar-sink-cache-entries {config.sink_entries}), "
            f"{one.total_bytes:,} B in all; got a budget of {available_bytes:,} B. Lower "
            "those flags or raise --mem-fraction-static")
    lo, hi = 1, max(1, available_bytes // (page_size * token_bytes))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid).total_bytes <= available_bytes:
            lo = mid
        else:
            hi = mid - 1
    return cost(lo)


def int2_sink_store_bytes(*, num_kv_heads: int, head_dim: int, num_layers: int,
                          config: OscarConfig) -> int:
    """Bytes of the pool's BF16 sink store: ``sink_entries x sink_size`` K+V rows per layer.

    The store keeps the BF16 sink rows of recently seen prompt prefixes so that a request
    reusing a radix-cache prefix gets exact sinks (docs/integrations.md section 2.2). It is
    allocated once, with the pool; ``sink_entries == 0`` or ``sink_size == 0`` gives 0.

    Parameters
    ----------
    num_kv_heads : int
        KV heads on this rank.
    head_dim : int
    num_layers : int
        Layers of this pool (SGLang's effective layers).
    config : OscarConfig
        ``sink_entries`` and ``sink_size`` are read.

    Returns
    -------
    int
        ``sink_entries * sink_size * (2 * num_kv_heads * head_dim * 2) * num_layers``.

    Example
    -------
    >>> int2_sink_store_bytes(num_kv_heads=8, head_dim=128, num_layers=36,
    ...                       config=OscarConfig())
    301989888
    """
    _check_dims(num_kv_heads=num_kv_heads, head_dim=head_dim, num_layers=num_layers)
    spec = _spec(num_kv_heads, head_dim, config)
    return config.sink_entries * config.sink_size * spec.bf16_bytes_per_token * num_layers


def int2_max_running_requests(token_capacity: int, sglang_choice: int,
                              config: OscarConfig) -> int:
    """Request rows the INT2 memory plan covers: ``token_capacity / tokens_per_request``,
    never more than SGLang's own choice."""
    return max(1, min(sglang_choice, token_capacity // config.tokens_per_request))
