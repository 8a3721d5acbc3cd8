"""Kernel operands prepared on the host: the rotations as tensor-core fragments, and the
query transform that lets the int8 QK skip masking its K operands.

:func:`mma_operand` converts a rotation once per tensor (cached weakly per source tensor)
into the fp16 ``mma.m16n8k16`` A-fragment order the decode kernel loads with one 16-byte
load per fragment. :func:`unmasked_k_query` is plain arithmetic on its elements, so the
kernel traces it on its float32 registers and the tests run it on tensors. Importing this
module needs neither torch's CUDA nor cutlass.
"""

from __future__ import annotations

import threading
import weakref


def unmasked_k_query(q, top_masked: bool = False):
    """The int8 QK's query for *unmasked* K operands (head_dim 128): ``q[i][j]`` is the
    query element of channel quarter ``i`` in byte ``j`` (0-3) of one 32-bit code word;
    returns ``Q[i][j]`` such that, with the operands ``u_i = w * 4^(3 - i) mod 2^32`` (no
    ``& 0xC0C0C0C0``: byte ``j`` of ``u_i`` also carries the lower quarters of byte ``j``,
    shifted, and the upper ones of byte ``j - 1``), ``sum_ij Q[i][j] byte_j(u_i) = 64
    sum_ij q[i][j] code_i(byte j)`` -- the same score as the masked fields ``64 * code``.

    Byte ``j`` of ``u_i`` is ``sum_{k <= i} c_kj 4^(k + 3 - i) + sum_{k > i} c_k,j-1
    4^(k - 1 - i)``, so code ``c_kj`` meets ``Q[i][j]`` (``i >= k``, weight ``4^(k + 3 -
    i)``) and ``Q[i][j + 1]`` (``i < k``, ``4^(k - 1 - i)``); asking for ``64 q[k][j]`` gives
    a triangular system, solved from byte 3 down and quarter 3 down (each ``Q`` its ``q``
    minus multiples ``<= 1/4`` of ones already known, at most ``1/4 + 1/16 + 1/64`` in all,
    so ``max|Q| <= max|q| / (1 - 0.33) < 1.5 max|q|``). Plain arithmetic on the elements,
    so the kernel traces it on its float32 registers and the tests run it on tensors.
    ``top_masked``: quarter 3's operand keeps its mask (``w & 0xC0C0C0C0``, 64 x the fields
    only), so only quarters 0-2 carry the other bits."""
    out = [[None] * 4 for _ in range(4)]
    for j in range(3, -1, -1):
        for k in range(3, -1, -1):
            x = q[k][j]
            for i in range(k + 1, 3 if top_masked else 4):
                x = x - out[i][j] * (4.0 ** (k - i))
            if j < 3:
                for i in range(k):
                    x = x - out[i][j + 1] * (4.0 ** (k - i - 4))
            out[k][j] = x
    return out


#: (id(base tensor), tag) -> (weakref to it, key of the view, operand); see _cached
_OPERANDS: dict = {}
_LOCK = threading.Lock()


def mma_operand(rot, transpose: bool):
    """A ``[H, D, D]`` rotation (float) as the decode kernel's fp16 tensor-core operand:
    ``A = rot[h]^T`` (``transpose``: the query rotation, ``q'^T = R_K^T q^T``) or
    ``A = rot[h]`` (the output rotation, ``o^T = R_V o'^T``) in ``mma.m16n8k16``
    A-fragment order, as int32 ``[H', D * D / 2]`` (``H' = 1`` when every head shares one
    matrix, i.e. ``H == 1`` or a stride-0 expand), plus the head stride in int32 words (0
    when shared).

    Element ``[h, ((mt * D/16 + ks) * 32 + lane) * 4 + r]`` holds the fp16 pair
    ``(A[m, k], A[m, k + 1])`` with ``m = 16 mt + lane // 4 + 8 (r % 2)`` and
    ``k = 16 ks + 2 (lane % 4) + 8 (r // 2)``. fp16 keeps 11 bits of the orthogonal
    matrix's entries (``|R| <= 1``), below the bf16 rounding of ``q'`` that follows and the
    kernel's bf16-level tolerance on ``o``.

    Cached per source tensor (weakly, keyed by its base tensor, the view's geometry and the
    version counter, so an in-place update or a new tensor is never served stale data); not
    cached while a CUDA graph is being captured (the conversion then runs inside the graph).
    """
    import torch

    def make():
        n, d, _ = rot.shape
        shared = n == 1 or rot.stride(0) == 0
        a = rot[:1] if shared else rot
        a = (a.transpose(-1, -2) if transpose else a).to(torch.float16)          # [H', m, k]
        mt = d // 16
        # (H, MT, RM, G, KS, RK, Q4, P) -> (H, MT, KS, G, Q4, RK, RM, P): m = 16 MT + 8 RM
        # + G, k = 16 KS + 8 RK + 2 Q4 + P, lane = 4 G + Q4, register r = RM + 2 RK
        frag = a.reshape(-1, mt, 2, 8, mt, 2, 4, 2).permute(0, 1, 4, 3, 6, 5, 2, 7)
        frag = frag.contiguous().view(-1, d * d).view(torch.int32)
        return frag, 0 if shared else d * d // 2
    return _cached(rot, "kT" if transpose else "v", make)


def _cached(rot, tag: str, make):
    """``make()`` for the rotation tensor ``rot``, cached per source tensor (weakly, keyed
    by its base tensor, the view's geometry and the version counter); not stored while a
    CUDA graph is being captured (the conversion then runs inside the graph)."""
    import torch

    base = rot._base if rot._base is not None else rot
    key = (rot.data_ptr(), tuple(rot.shape), tuple(rot.stride()), rot._version, tag)
    with _LOCK:
        hit = _OPERANDS.get((id(base), tag))
        if hit is not None and hit[0]() is base and hit[1] == key:
            return hit[2]
    result = make()
    if not (rot.is_cuda and torch.cuda.is_current_stream_capturing()):
        with _LOCK:
            if len(_OPERANDS) >= 256:      # forget the entries of freed tensors
                for k in [k for k, v in _OPERANDS.items() if v[0]() is None]:
                    del _OPERANDS[k]
            _OPERANDS[(id(base), tag)] = (weakref.ref(base), key, result)
    return result
