"""What the plugin records inside one SGLang process, in one object.

The hooks run inside SGLang's own functions and can only record what they see; the pool
and the attention backend read it later. :class:`PluginState` holds all of it:

* the request rows SGLang is building the KV pool for (the pool allocates one window slot
  per row, :meth:`PluginState.planning`);
* the request rows assigned since their last forward, whose window slots hold another
  request's rows (:meth:`PluginState.mark_fresh_rows`);
* each request row's sink-store key (:meth:`PluginState.set_row_sink_key`);
* the INT2 pool of this process (the prefix-match hook asks it about stored sinks).

The hooks module owns the process's instance (``hooks.STATE``) and hands it to the pool it
builds; the attention backend reads it from the pool (``pool.state``). Tests build their
own.
"""

from __future__ import annotations

from contextlib import contextmanager

from ...errors import UnsupportedConfigError


class PluginState:
    """Request-row bookkeeping shared by the hooks, the INT2 pool and its backend."""

    def __init__(self) -> None:
        self._planned_rows: list[int] = []
        self._fresh_rows: set[int] = set()
        self._row_sink_keys: dict[int, str | None] = {}
        #: The INT2 pool of this process (set by the pool when it is built).
        self.pool = None

    # ------------------------------------------------------------ pool building
    @contextmanager
    def planning(self, max_running_requests: int):
        """Within the block, the pool being built plans ``max_running_requests`` rows."""
        self._planned_rows.append(int(max_running_requests))
        try:
            yield
        finally:
            self._planned_rows.pop()

    def planned_rows(self) -> int:
        """Request rows of the pool being built (SGLang's ``max_running_requests``)."""
        if not self._planned_rows:
            raise UnsupportedConfigError("--kv-cache-dtype int2: the INT2 pool was requested "
                                         "outside KVCacheConfigurator._build_token_to_kv_pool "
                                         "(its window slots are planned from SGLang's "
                                         "max_running_requests)")
        return self._planned_rows[-1]

    # ------------------------------------------------------------- request rows
    def mark_fresh_rows(self, rows) -> None:
        """Rows SGLang has just assigned (``ReqToTokenPool.alloc_rows``)."""
        self._fresh_rows.update(int(r) for r in rows)

    def is_fresh(self, row: int) -> bool:
        return int(row) in self._fresh_rows

    def clear_fresh(self, rows) -> None:
        """Rows that ran a forward: their window slots are theirs from now on."""
        for r in rows:
            self._fresh_rows.discard(int(r))

    def set_row_sink_key(self, row: int, key: str | None) -> None:
        """The sink key of a request row (``ReqToTokenPool.alloc``)."""
        self._row_sink_keys[int(row)] = key

    def row_sink_key(self, row: int) -> str | None:
        return self._row_sink_keys.get(int(row))

    # ------------------------------------------------------------------ the pool
    def has_sink_entry(self, key: str | None) -> bool:
        """Whether this process's pool stores the sinks of ``key``."""
        return self.pool is not None and key is not None and key in self.pool.sink_index

    @property
    def page_size(self) -> int:
        """Page size of this process's pool (1 before it is built)."""
        return self.pool.page_size if self.pool is not None else 1
