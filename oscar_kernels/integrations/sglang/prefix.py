"""Prefix caching under the INT2 cache: how much of a radix-cache hit a new request may
reuse, and the key of the BF16 sink store (docs/integrations.md, "Prefix caching")."""

from __future__ import annotations

import hashlib


def reusable_prefix_len(prefix_len: int, *, sink_size: int, recent_size: int, page_size: int,
                        have_sinks: bool) -> int:
    """How much of a radix-cache hit of ``prefix_len`` tokens a new request may reuse.

    The new request's window slot must hold BF16 rows of its sinks ``[0, S)`` and of the
    ``W`` positions before its first new query. The sinks come from the sink store (keyed
    by the first ``S`` token ids); the recent rows are recomputed: the reused prefix is cut
    to ``P' = floor((P - W) / page_size) * page_size`` so SGLang recomputes
    ``[P', P)`` from real K/V. Without stored sinks, or when ``P <= S + W``, nothing is
    reused (``0``): the request recomputes its prompt, which is always exact.

    Example
    -------
    >>> reusable_prefix_len(1000, sink_size=64, recent_size=256, page_size=16, have_sinks=True)
    736
    """
    if prefix_len <= sink_size + recent_size or not have_sinks:
        return 0
    return (prefix_len - recent_size) // page_size * page_size


def sink_key(token_ids, sink_size: int, extra=None) -> str | None:
    """Key of the sink store: the first ``sink_size`` token ids (plus SGLang's
    ``extra_key``/LoRA id, which change K/V for the same tokens); ``None`` when shorter."""
    if sink_size <= 0 or len(token_ids) < sink_size:
        return None
    h = hashlib.sha1(repr((tuple(int(t) for t in token_ids[:sink_size]), extra)).encode())
    return h.hexdigest()
