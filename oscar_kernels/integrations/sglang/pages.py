"""SGLang's token slots as INT2 pages: the FlashInfer page table of a batch, read from
SGLang's ``req_to_token`` rows, and a request's window slot rebuilt from shared pages.

SGLang token slot ``s`` is page ``s // page_size``, row ``s % page_size``. Plain torch: these
run, and are tested, without SGLang.
"""

from __future__ import annotations

import torch

from ...reference.paged import gather_int2


def page_table_from_req_to_token(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                                 seq_lens: torch.Tensor, page_size: int, *,
                                 seq_lens_cpu: torch.Tensor | None = None):
    """FlashInfer page table from SGLang's token-granular ``req_to_token`` rows.

    SGLang stores, per request row, the token slot of every position; pages are
    ``page_size`` consecutive slots, so page id = slot // page_size and the first slot of
    each page is at positions ``0, page_size, 2 * page_size, ...``.

    Parameters
    ----------
    req_to_token : Tensor ``[num_rows, max_context_len]`` int32
    req_pool_indices : Tensor ``[batch_size]``
    seq_lens : Tensor ``[batch_size]``
        Lengths after this forward's tokens.
    page_size : int
    seq_lens_cpu : Tensor, optional
        Host copy of ``seq_lens`` (SGLang keeps one); avoids a device sync.

    Returns
    -------
    ``kv_indptr [batch_size + 1]``, ``kv_indices [sum(num_pages)]``,
    ``kv_last_page_len [batch_size]``, all int32 on ``req_to_token.device``.
    """
    dev = req_to_token.device
    lens = (seq_lens if seq_lens_cpu is None else seq_lens_cpu).to("cpu", torch.int64)
    pages = (lens + page_size - 1) // page_size
    kv_indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.cumsum(pages, 0)
    rows = req_pool_indices.to(dev, torch.int64)
    max_pages = int(pages.max()) if len(lens) else 0
    cols = torch.arange(max_pages, device=dev) * page_size
    table = req_to_token[rows][:, cols] if max_pages else req_to_token[rows][:, :0]
    mask = torch.arange(max_pages, device=dev)[None, :] < pages.to(dev)[:, None]
    kv_indices = (table[mask].to(torch.int64) // page_size).to(torch.int32)
    last = torch.where(pages > 0, (lens - 1) % page_size + 1, torch.zeros_like(lens))
    return (kv_indptr.to(dev, torch.int32), kv_indices, last.to(dev, torch.int32))


def rebuild_window_from_pages(cache, pages: torch.Tensor, window_slot: int,
                              prefix_len: int, *, sinks: bool = True) -> None:
    """Fill a request's window slot for a reused prefix of ``prefix_len`` tokens from pages.

    The slot of a request that starts on a cached prefix holds another request's rows.
    The recent rows ``[max(S, P - W), P)`` (and, with ``sinks``, the sink rows
    ``[0, min(S, P))``) are rewritten from the shared INT2 pages (dequantized, rotated
    space, as BF16), so nothing stale is ever read. These rows carry INT2 precision; the
    plugin only lets queries that SGLang recomputes read them (docs/integrations.md).
    """
    spec = cache.spec
    s, w = spec.sink_size, spec.recent_size
    if prefix_len <= 0:
        return
    k, v = gather_int2(cache, pages, prefix_len)
    pos = torch.arange(prefix_len, device=k.device)
    keep = ((pos < s) & sinks) | ((pos >= max(s, prefix_len - w)) & (w > 0))
    pos = pos[keep]
    rows = torch.where(pos < s, pos, s + (pos % w if w > 0 else pos))
    cache.k_window[window_slot, rows] = k[keep].to(cache.k_window.dtype)
    cache.v_window[window_slot, rows] = v[keep].to(cache.v_window.dtype)
