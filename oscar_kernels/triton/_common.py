"""Host-side helpers shared by the Triton launchers: interpreter detection, page strides,
SM counts."""

from __future__ import annotations

import os

import torch


def interpret_mode(device: torch.device) -> bool:
    """True when kernels run under the Triton CPU interpreter (``TRITON_INTERPRET=1``)."""
    return device.type == "cpu" or os.environ.get("TRITON_INTERPRET") == "1"


def page_strides(t: torch.Tensor, kv_layout: str) -> tuple[int, int, int]:
    """Element strides ``(page, slot, head)`` of a page tensor in either layout.

    NHD tensors are ``[num_pages, page_size, H, ...]`` and HND ``[num_pages, H, page_size, ...]``;
    kernels address ``page * s_page + slot * s_slot + head * s_head`` and never see the layout.
    """
    s = t.stride()
    return (s[0], s[1], s[2]) if kv_layout == "NHD" else (s[0], s[2], s[1])


_NUM_SMS: dict[int, int] = {}


def num_sms(device: torch.device, off_gpu: int) -> int:
    """SM count of a CUDA ``device`` (cached per index); ``off_gpu`` for any other device
    (the interpreter), so that CPU runs plan as the caller chooses."""
    if device.type != "cuda":
        return off_gpu
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]
