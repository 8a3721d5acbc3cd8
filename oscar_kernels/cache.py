"""The paged mixed-precision KV cache of one attention layer (docs/format.md).

Two stores share one set of page ids and window slots:

* INT2 pages: ``k_codes``/``v_codes`` uint8 ``[num_pages, page_size, H, D/4]`` (NHD) or
  ``[num_pages, H, page_size, D/4]`` (HND), and ``k_params``/``v_params`` with
  ``[..., D/group_size, 2]`` (scale, zero) in ``spec.scale_dtype`` beside them. Every
  appended token is written here.
* BF16 windows: ``k_window``/``v_window`` ``[num_window_slots, sink + recent, H, D]``,
  one slot per running sequence: rows ``0..sink-1`` hold the sink, rows
  ``sink + (position % recent)`` the recent ring. Stored rotated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import expect
from .spec import CacheSpec


@dataclass
class Int2PagedKVCache:
    """Tensors of one layer's cache plus the :class:`CacheSpec` that fixes their bytes."""

    spec: CacheSpec
    k_codes: torch.Tensor
    k_params: torch.Tensor
    v_codes: torch.Tensor
    v_params: torch.Tensor
    k_window: torch.Tensor
    v_window: torch.Tensor

    @classmethod
    def allocate(cls, spec: CacheSpec, num_pages: int, num_window_slots: int, *,
                 device: torch.device | str | None = None) -> "Int2PagedKVCache":
        """Uninitialized storage for ``num_pages`` pages and ``num_window_slots`` slots.

        Example
        -------
        >>> from oscar_kernels import CacheSpec, Int2PagedKVCache
        >>> cache = Int2PagedKVCache.allocate(CacheSpec(num_kv_heads=8, head_dim=128,
        ...                                   page_size=16), num_pages=64, num_window_slots=4)
        >>> tuple(cache.k_codes.shape)
        (64, 16, 8, 32)
        """
        expect(isinstance(num_pages, int) and num_pages > 0, "num_pages", "a positive int", num_pages)
        expect(isinstance(num_window_slots, int) and num_window_slots > 0,
               "num_window_slots", "a positive int", num_window_slots)

        def pages(shape, dtype):
            return torch.empty(shape, dtype=dtype, device=device)

        return cls(
            spec=spec,
            k_codes=pages(spec.codes_shape(num_pages), torch.uint8),
            k_params=pages(spec.params_shape(num_pages), spec.scale_dtype),
            v_codes=pages(spec.codes_shape(num_pages), torch.uint8),
            v_params=pages(spec.params_shape(num_pages), spec.scale_dtype),
            k_window=pages(spec.window_shape(num_window_slots), torch.bfloat16),
            v_window=pages(spec.window_shape(num_window_slots), torch.bfloat16),
        )

    @property
    def num_pages(self) -> int:
        return self.k_codes.shape[0]

    @property
    def num_window_slots(self) -> int:
        return self.k_window.shape[0]

    @property
    def device(self) -> torch.device:
        return self.k_codes.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n) for n in
                ("k_codes", "k_params", "v_codes", "v_params", "k_window", "v_window")}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def validate(self) -> None:
        """Check every tensor's shape, dtype, device and contiguity against ``spec``."""
        spec = self.spec
        want = {
            "k_codes": (spec.codes_shape(self.num_pages), torch.uint8),
            "v_codes": (spec.codes_shape(self.num_pages), torch.uint8),
            "k_params": (spec.params_shape(self.num_pages), spec.scale_dtype),
            "v_params": (spec.params_shape(self.num_pages), spec.scale_dtype),
            "k_window": (spec.window_shape(self.num_window_slots), torch.bfloat16),
            "v_window": (spec.window_shape(self.num_window_slots), torch.bfloat16),
        }
        for name, (shape, dtype) in want.items():
            t = getattr(self, name)
            expect(t.dtype == dtype, f"cache.{name}", f"dtype {dtype}", t, TypeError)
            expect(tuple(t.shape) == tuple(shape), f"cache.{name}", f"shape {tuple(shape)}", t)
            expect(t.device == self.device, f"cache.{name}", f"device {self.device}", t.device)
            expect(t.is_contiguous(), f"cache.{name}", "a contiguous tensor", "a strided view")
