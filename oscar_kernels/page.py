"""Page-table helpers with FlashInfer's semantics (``flashinfer.page``).

* :func:`get_seq_lens`: sequence lengths from ``kv_indptr`` / ``kv_last_page_len``.
* :func:`get_batch_indices_positions`: per appended token, its sequence and its absolute
  position in that sequence, the inputs of
  :func:`~oscar_kernels.ops.quantize_append_paged_kv_cache`.

Both are pure torch, keep the inputs' device and never synchronize with it (no host reads),
so they can run inside CUDA-graph capture. They are re-exported by :mod:`oscar_kernels.ops`
and :mod:`oscar_kernels.integrations.flashinfer`.
"""

from __future__ import annotations

import torch

from .errors import expect

__all__ = ["get_batch_indices_positions", "get_seq_lens"]


def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                 page_size: int) -> torch.Tensor:
    """Sequence lengths from a page table, FlashInfer's ``get_seq_lens``.

    Parameters
    ----------
    kv_indptr : Tensor ``[batch_size + 1]`` int32
    kv_last_page_len : Tensor ``[batch_size]`` int32
    page_size : int

    Returns
    -------
    Tensor ``[batch_size]``, ``clamp(num_pages - 1, min=0) * page_size + kv_last_page_len``
    (FlashInfer's formula, dtype of the inputs, same device, no host sync).

    Example
    -------
    >>> import torch
    >>> get_seq_lens(torch.tensor([0, 3, 4], dtype=torch.int32),
    ...              torch.tensor([13, 8], dtype=torch.int32), 16).tolist()
    [45, 8]
    """
    expect(isinstance(kv_indptr, torch.Tensor) and kv_indptr.dim() == 1, "kv_indptr",
           "a 1-D tensor [batch_size + 1]", kv_indptr, TypeError)
    expect(isinstance(kv_last_page_len, torch.Tensor)
           and kv_last_page_len.shape == (kv_indptr.shape[0] - 1,), "kv_last_page_len",
           f"a tensor [{kv_indptr.shape[0] - 1}]", kv_last_page_len)
    expect(isinstance(page_size, int) and page_size > 0, "page_size", "a positive int", page_size)
    return (torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size
            + kv_last_page_len)


def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int,
                                batch_indices: torch.Tensor | None = None,
                                positions: torch.Tensor | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per appended token, its sequence and position: FlashInfer's helper, graph-safe.

    Parameters
    ----------
    append_indptr : Tensor ``[batch_size + 1]`` int32
        Offsets of each sequence's new tokens in the ragged ``[nnz, ...]`` tensor.
    seq_lens : Tensor ``[batch_size]``
        Sequence lengths *after* the append (:func:`get_seq_lens`).
    nnz : int
        Number of rows of the ragged tensor. Rows at or past ``append_indptr[-1]`` get
        batch index ``-1`` and position ``0``, as in FlashInfer.
    batch_indices, positions : Tensor ``[nnz]`` int32, optional
        Preallocated outputs, written in place.

    Returns
    -------
    ``(batch_indices, positions)``, int32 ``[nnz]``: token ``i`` of sequence ``b`` (counted
    from ``append_indptr[b]``) sits at the absolute position
    ``seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + i`` of its sequence.

    Example
    -------
    >>> import torch
    >>> b, p = get_batch_indices_positions(torch.tensor([0, 1, 3], dtype=torch.int32),
    ...                                    torch.tensor([5, 5], dtype=torch.int32), 3)
    >>> b.tolist(), p.tolist()
    ([0, 1, 1], [4, 3, 4])
    """
    expect(isinstance(append_indptr, torch.Tensor) and append_indptr.dim() == 1
           and append_indptr.shape[0] >= 1, "append_indptr", "a 1-D tensor [batch_size + 1]",
           append_indptr, TypeError)
    batch_size = append_indptr.shape[0] - 1
    device = append_indptr.device
    expect(isinstance(seq_lens, torch.Tensor) and tuple(seq_lens.shape) == (batch_size,),
           "seq_lens", f"a tensor [{batch_size}] (batch_size)", seq_lens)
    expect(isinstance(nnz, int) and nnz >= 0, "nnz", "a non-negative int", nnz)
    for name, t in (("batch_indices", batch_indices), ("positions", positions)):
        if t is not None:
            expect(isinstance(t, torch.Tensor) and t.dtype == torch.int32, name,
                   "an int32 tensor", t, TypeError)
            expect(tuple(t.shape) == (nnz,) and t.device == device, name,
                   f"shape ({nnz},) on {device}", t)
    ap = append_indptr.to(torch.int64)
    rows = torch.arange(nnz, device=device, dtype=torch.int64)
    b = torch.searchsorted(ap[1:].contiguous(), rows, right=True)
    valid = b < batch_size
    bc = b.clamp(max=max(batch_size - 1, 0))
    if batch_size > 0:
        pos = rows + seq_lens.to(torch.int64)[bc] - ap[1:][bc]
    else:
        pos = torch.zeros_like(rows)
    b_out = torch.where(valid, b, torch.full_like(b, -1)).to(torch.int32)
    p_out = torch.where(valid, pos, torch.zeros_like(pos)).to(torch.int32)
    if batch_indices is None:
        batch_indices = b_out
    else:
        batch_indices.copy_(b_out)
    if positions is None:
        positions = p_out
    else:
        positions.copy_(p_out)
    return batch_indices, positions
