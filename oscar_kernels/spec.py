"""Frozen descriptions of the INT2 KV cache format, version 1 (docs/format.md).

Everything that fixes the bytes of a cache lives here: the quantization scheme, the
page geometry, the mixed-precision windows, and the helpers that turn them into shapes
and byte counts. Nothing here allocates or computes on tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import expect

FORMAT_VERSION = 1

#: Published default clip ratios (fraction of the sorted |x| of a group kept unclipped).
DEFAULT_K_CLIP = 0.96
DEFAULT_V_CLIP = 0.92
DEFAULT_SINK_SIZE = 64
DEFAULT_RECENT_SIZE = 256

#: Quantization levels of a 2-bit code.
NUM_LEVELS = 4
#: Codes packed into one byte.
CODES_PER_BYTE = 4

KV_LAYOUTS = ("NHD", "HND")
SCALE_DTYPES = (torch.float16, torch.float32)


def is_power_of_two(n: int) -> bool:
    return isinstance(n, int) and n > 0 and (n & (n - 1)) == 0


@dataclass(frozen=True)
class CacheSpec:
    """Geometry and quantization scheme of one layer's INT2 paged KV cache.

    Parameters
    ----------
    num_kv_heads, head_dim : int
        ``head_dim`` is a power of two, at least 16 (Hadamard rotation, 4-way packing).
    page_size : int
        Tokens per page, any positive integer.
    group_size : int
        Channels sharing one (scale, zero) pair; divides ``head_dim``, at least 4.
        Default ``head_dim`` (one group per token and head).
    sink_size, recent_size : int
        First ``sink_size`` and last ``recent_size`` tokens of each sequence are read
        in BF16 from the window store; everything else from the INT2 pages.
    kv_layout : {"NHD", "HND"}
        Order of the page dimensions, as in FlashInfer.
    scale_dtype : torch.float16 or torch.float32
        Storage dtype of the per-group scale and zero.
    """

    num_kv_heads: int
    head_dim: int
    page_size: int
    group_size: int | None = None
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    kv_layout: str = "NHD"
    scale_dtype: torch.dtype = torch.float16

    def __post_init__(self) -> None:
        if self.group_size is None:
            object.__setattr__(self, "group_size", self.head_dim)
        expect(isinstance(self.num_kv_heads, int) and self.num_kv_heads > 0,
               "num_kv_heads", "a positive int", self.num_kv_heads)
        expect(is_power_of_two(self.head_dim) and self.head_dim >= 16,
               "head_dim", "a power of two >= 16", self.head_dim)
        expect(isinstance(self.page_size, int) and self.page_size > 0,
               "page_size", "a positive int", self.page_size)
        expect(isinstance(self.group_size, int) and self.group_size >= 4
               and self.head_dim % self.group_size == 0,
               "group_size", f"an int >= 4 dividing head_dim={self.head_dim}", self.group_size)
        expect(isinstance(self.sink_size, int) and self.sink_size >= 0,
               "sink_size", "a non-negative int", self.sink_size)
        expect(isinstance(self.recent_size, int) and self.recent_size >= 0,
               "recent_size", "a non-negative int", self.recent_size)
        expect(self.kv_layout in KV_LAYOUTS, "kv_layout", f"one of {KV_LAYOUTS}", self.kv_layout)
        expect(self.scale_dtype in SCALE_DTYPES, "scale_dtype", "torch.float16 or torch.float32",
               self.scale_dtype, TypeError)

    # ----------------------------------------------------------------- shapes
    @property
    def packed_dim(self) -> int:
        return self.head_dim // CODES_PER_BYTE

    @property
    def num_groups(self) -> int:
        return self.head_dim // self.group_size

    @property
    def window_size(self) -> int:
        return self.sink_size + self.recent_size

    def codes_shape(self, num_pages: int) -> tuple[int, ...]:
        """``[num_pages, page_size, num_kv_heads, packed_dim]`` (NHD) or heads first (HND)."""
        if self.kv_layout == "NHD":
            return (num_pages, self.page_size, self.num_kv_heads, self.packed_dim)
        return (num_pages, self.num_kv_heads, self.page_size, self.packed_dim)

    def params_shape(self, num_pages: int) -> tuple[int, ...]:
        """Scale/zero pairs: codes shape with ``[num_groups, 2]`` instead of ``packed_dim``."""
        return self.codes_shape(num_pages)[:-1] + (self.num_groups, 2)

    def window_shape(self, num_slots: int) -> tuple[int, ...]:
        """``[num_slots, sink_size + recent_size, num_kv_heads, head_dim]`` (always NHD)."""
        return (num_slots, self.window_size, self.num_kv_heads, self.head_dim)

    # ------------------------------------------------------------------ bytes
    @property
    def int2_bytes_per_token(self) -> int:
        """Bytes of K plus V one token occupies in the INT2 pages (codes and scale/zero)."""
        param_bytes = 2 * self.num_groups * (2 if self.scale_dtype == torch.float16 else 4)
        return 2 * self.num_kv_heads * (self.packed_dim + param_bytes)

    @property
    def bf16_bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * 2

    def bytes_per_sequence(self, seq_len: int) -> int:
        """K+V bytes of one sequence of ``seq_len`` tokens: INT2 pages (every token is
        quantized on append) plus one window slot, rounded up to whole pages."""
        pages = -(-seq_len // self.page_size)
        return (pages * self.page_size * self.int2_bytes_per_token
                + self.window_size * self.bf16_bytes_per_token)

    def effective_bits(self, seq_len: int) -> float:
        """Bits per K/V element at ``seq_len`` tokens, windows and scales included."""
        elements = 2 * self.num_kv_heads * self.head_dim * seq_len
        return 8.0 * self.bytes_per_sequence(seq_len) / elements


def window_row(position: int, sink_size: int, recent_size: int) -> int:
    """Row of the window store that holds ``position`` while it is inside a window."""
    if position < sink_size:
        return position
    return sink_size + position % recent_size


def seq_lens_from_page_table(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
                             page_size: int) -> torch.Tensor:
    """Tokens per sequence, FlashInfer's rule: ``(num_pages - 1) * page_size + last_page_len``."""
    num_pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64)
    lens = (num_pages - 1).clamp(min=0) * page_size + kv_last_page_len.to(torch.int64)
    return torch.where(num_pages > 0, lens, torch.zeros_like(lens))
