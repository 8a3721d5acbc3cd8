"""CuTe DSL Hopper kernels: the fast path of :mod:`oscar_kernels.ops` (``backend="cute"``).

Implements ``decode`` (INT2/BF16 paged decode attention) on sm_90; ``append`` and
``extend`` raise :class:`~oscar_kernels.errors.UnsupportedConfigError` so
``backend="auto"`` falls back to Triton. Kernels JIT-compile when ``nvidia-cutlass-dsl`` is
installed, else come from the prebuilt bundle (``$OSCAR_CUTE_BUNDLE`` names another one).
Importing this module needs neither torch's CUDA nor cutlass.

One file per concern:

* :mod:`.config` constants, the kernel compile key and the C ABI's argument lists;
* :mod:`.plan` the plan rules (build, warps per CTA, splits);
* :mod:`.launch` the launcher (:func:`decode`, :func:`can_implement`);
* :mod:`.operands` host-prepared kernel operands, :mod:`.workspace` the ticket buffers;
* :mod:`.decode_sm90` (with :mod:`.decode_ring`, :mod:`.decode_rotation`,
  :mod:`.decode_chunk`, :mod:`.decode_window`, :mod:`.decode_tail`) and :mod:`.merge_sm90`
  the kernels, :mod:`.ptx` their inline-PTX wrappers;
* :mod:`.bundle` finds and loads kernels, :mod:`.aot` builds the prebuilt bundle.
"""

from __future__ import annotations

from ..errors import UnsupportedConfigError
from .launch import can_implement, decode, decode_steps

__all__ = ["append", "can_implement", "decode", "decode_steps", "extend"]


def append(*_args, **_kwargs):
    raise UnsupportedConfigError("the CuTe backend does not implement append (use triton)")


def extend(*_args, **_kwargs):
    raise UnsupportedConfigError("the CuTe backend does not implement extend (use triton)")
