"""Pure-torch float32 reference: the executable spec every backend is tested against."""

from .paged import (append_paged_kv, gather_int2, gather_window, paged_decode, paged_extend,
                    rotate, rotate_queries, unrotate_output, window_rule_attention)
from .quant import (clip_groups, clip_index, dequantize_groups, pack_codes, quantize_groups,
                    unpack_codes)
from .rotation_math import (bit_reversal_matrix, bit_reversal_permutation, compose_rotation,
                            hadamard, hadamard_rotation, orthogonality_error)

__all__ = [
    "append_paged_kv", "gather_int2", "gather_window", "paged_decode", "paged_extend", "rotate",
    "rotate_queries", "unrotate_output", "window_rule_attention", "clip_groups", "clip_index",
    "dequantize_groups", "pack_codes", "quantize_groups", "unpack_codes", "bit_reversal_matrix",
    "bit_reversal_permutation", "compose_rotation", "hadamard", "hadamard_rotation",
    "orthogonality_error",
]
