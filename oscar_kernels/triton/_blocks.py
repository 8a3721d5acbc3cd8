"""Device helpers shared by the decode and extend kernels: one key block of attention.

All attention state lives in rotated space and is split into the four channel quarters
``[i·D/4, (i+1)·D/4)`` that one packed byte row unpacks into (docs/format.md §3): a query
tile is ``q0..q3 [M, D/4]``, the output accumulator ``a0..a3 [M, D/4]``. Scores are in
base 2 (the query carries ``sm_scale · log2(e)``), softmax is online (``m``, ``l``).

INT2 keys/values never become float rows: for a group with (scale, zero),
``q'·k̂ = scale · (q'·codes) + zero · Σ q'`` and ``Σ_t p_t v̂_t = Σ_t (p_t scale_t) codes_t
+ Σ_t p_t zero_t``, so the inner loop does quarter-wide code dots on the tensor cores and
per-token (not per-element) scale/zero arithmetic; the zero terms go to ``z0..z3 [M]``.
A quarter belongs to group ``i · NG // 4`` (``NG = D / group_size`` in {1, 2, 4}).

``DOT16`` (GPU): codes and the query are fp16 in the code dots (codes 0..3 are exact;
the query keeps 11 bits, above bf16's 8), ``p·scale`` is fp16 in the value dot;
BF16 window rows use TF32 dots on fp32 operands. Without it (CPU interpreter, whose
low-precision dots are unreliable) every dot is IEEE fp32.

``UNPACK`` picks how packed bytes become dot operands:

* ``0`` element-wise: ``(byte >> 2i) & 3`` per element (the interpreter's path);
* ``1`` "magic" (PTX, 1.5 instructions per code): shift, mask, ``prmt`` each code under an
  ``0x64`` high byte (fp16 ``1024 + c``), ``sub.f16x2`` of 1024;
* ``2`` "subnormal" (PTX, 0.625 instructions per code): the four bytes are spread once into
  the low bytes of two 16-bit halves (two ``prmt``, shared by the four quarters), then quarter
  ``i`` is one ``and`` with ``0x0003 << 2i`` per half. The masked half *is* an fp16
  subnormal of value ``c · 4^i · 2^-24``, exact, with no offset to subtract and no shift.
  The powers of two are folded into the algebra: the query quarter ``i`` is pre-scaled by
  ``4^-i`` (``_int2_query``), the key scale by ``2^24`` (``KSCALE``), and the caller
  multiplies the value accumulator of quarter ``i`` by ``2^24 / 4^i`` once after the
  INT2 loop (``_int2_unscale``). On the CPU the same algebra runs with fp32 codes
  ``c · 4^i · 2^-24``, so the interpreter tests check the folding.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _softmax_update(s, m_i, l_i):
    """``s [M, N]`` base-2 scores (``-inf`` where masked) → ``p``, rescale ``alpha``, new m, l."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, axis=1)
    return p, alpha, m_new, l_new


def _unpack_asm(shift: int) -> str:
    """PTX: 4 packed bytes in ``$2`` → codes ``(byte >> shift) & 3`` as 4 fp16 in ``$0, $1``."""
    mask = "and.b32 t, $2, 0x03030303;" if shift == 0 else (
        f"shr.b32 t, $2, {shift}; and.b32 t, t, 0x03030303;")
    return ("{ .reg .b32 t, hi, k; " + mask + " mov.b32 hi, 0x64646464; mov.b32 k, 0x64006400;"
            " prmt.b32 $0, t, hi, 0x5140; prmt.b32 $1, t, hi, 0x7362;"
            " sub.f16x2 $0, $0, k; sub.f16x2 $1, $1, k; }")


_UNPACK_ASM_0 = tl.constexpr(_unpack_asm(0))
_UNPACK_ASM_1 = tl.constexpr(_unpack_asm(2))
_UNPACK_ASM_2 = tl.constexpr(_unpack_asm(4))
_UNPACK_ASM_3 = tl.constexpr(_unpack_asm(6))


def _subnormal_asm(quarter: int) -> str:
    """PTX: 4 packed bytes in ``$2`` → quarter ``quarter`` codes as 4 fp16 subnormals
    ``c · 4^quarter · 2^-24`` in ``$0, $1``. The two ``prmt`` (byte k → low byte of half k)
    are identical for every quarter, so ptxas computes them once per register."""
    mask = 0x00030003 << (2 * quarter)
    return ("{ .reg .b32 t, u; prmt.b32 t, $2, $2, 0x1100; prmt.b32 u, $2, $2, 0x3322;"
            f" and.b32 $0, t, {mask:#010x}; and.b32 $1, u, {mask:#010x}; }}")


_SUBNORMAL_ASM_0 = tl.constexpr(_subnormal_asm(0))
_SUBNORMAL_ASM_1 = tl.constexpr(_subnormal_asm(1))
_SUBNORMAL_ASM_2 = tl.constexpr(_subnormal_asm(2))
_SUBNORMAL_ASM_3 = tl.constexpr(_subnormal_asm(3))
TWO_M24: tl.constexpr = tl.constexpr(2.0 ** -24)
TWO_24: tl.constexpr = tl.constexpr(2.0 ** 24)


@triton.jit
def _codes_quarter(raw8, I: tl.constexpr, DOT16: tl.constexpr, UNPACK: tl.constexpr):
    """Codes of quarter ``I`` from packed bytes ``raw8 [N, D/4]`` (uint8) in the dot dtype.

    ``UNPACK`` as in the module docstring. ``1``/``2`` need ``DOT16`` (PTX, fp16); without
    ``DOT16``, ``2`` gives fp32 ``c · 4^I · 2^-24`` and ``0``/``1`` fp32 ``c``.
    """
    if DOT16 and UNPACK == 2:
        if I == 0:
            return tl.inline_asm_elementwise(_SUBNORMAL_ASM_0, "=r,=r,r", [raw8],
                                             dtype=tl.float16, is_pure=True, pack=4)
        elif I == 1:
            return tl.inline_asm_elementwise(_SUBNORMAL_ASM_1, "=r,=r,r", [raw8],
                                             dtype=tl.float16, is_pure=True, pack=4)
        elif I == 2:
            return tl.inline_asm_elementwise(_SUBNORMAL_ASM_2, "=r,=r,r", [raw8],
                                             dtype=tl.float16, is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(_SUBNORMAL_ASM_3, "=r,=r,r", [raw8],
                                             dtype=tl.float16, is_pure=True, pack=4)
    elif DOT16 and UNPACK == 1:
        if I == 0:
            return tl.inline_asm_elementwise(_UNPACK_ASM_0, "=r,=r,r", [raw8], dtype=tl.float16,
                                             is_pure=True, pack=4)
        elif I == 1:
            return tl.inline_asm_elementwise(_UNPACK_ASM_1, "=r,=r,r", [raw8], dtype=tl.float16,
                                             is_pure=True, pack=4)
        elif I == 2:
            return tl.inline_asm_elementwise(_UNPACK_ASM_2, "=r,=r,r", [raw8], dtype=tl.float16,
                                             is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(_UNPACK_ASM_3, "=r,=r,r", [raw8], dtype=tl.float16,
                                             is_pure=True, pack=4)
    else:
        c = (raw8.to(tl.int32) >> (2 * I)) & 3
        if UNPACK == 2:
            # the subnormal path's values, in fp32 (interpreter): c · 4^I · 2^-24
            return c.to(tl.float32) * (TWO_M24 * (4 ** I))
        elif DOT16:
            # 0x6400 is fp16 1024.0 with a zero mantissa: (c | 0x6400) reinterpreted is
            # 1024 + c exactly, so an OR and an fp16 subtract replace an int→float conversion.
            f = (c | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
            return f - 1024.0
        else:
            return c.to(tl.float32)


@triton.jit
def _dot(a, b, DOT16: tl.constexpr):
    if DOT16:
        return tl.dot(a, b)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _dot_acc(a, b, acc, DOT16: tl.constexpr):
    """``acc + a @ b`` accumulated inside the dot (no separate add)."""
    if DOT16:
        return tl.dot(a, b, acc)
    else:
        return tl.dot(a, b, acc, input_precision="ieee")


@triton.jit
def _dot_f32(a, b, DOT16: tl.constexpr):
    """fp32 operands: TF32 on the GPU, IEEE in the interpreter."""
    if DOT16:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _int2_query(q0, q1, q2, q3, DOT16: tl.constexpr, UNPACK: tl.constexpr):
    """Query quarters as the INT2 dots take them (fp16 on the fast path; quarter ``i``
    times ``4^-i`` for ``UNPACK == 2``) and the row sums of the unscaled values (the
    ``zero * sum(q)`` term of the folded dequantization)."""
    if UNPACK == 2:
        # exact powers of two: the rounding to fp16 is that of q itself (barring subnormals)
        q1 = q1 * 0.25
        q2 = q2 * 0.0625
        q3 = q3 * 0.015625
    if DOT16:
        qc0 = q0.to(tl.float16)
        qc1 = q1.to(tl.float16)
        qc2 = q2.to(tl.float16)
        qc3 = q3.to(tl.float16)
    else:
        qc0 = q0
        qc1 = q1
        qc2 = q2
        qc3 = q3
    qs0 = tl.sum(qc0.to(tl.float32), axis=1)
    qs1 = tl.sum(qc1.to(tl.float32), axis=1)
    qs2 = tl.sum(qc2.to(tl.float32), axis=1)
    qs3 = tl.sum(qc3.to(tl.float32), axis=1)
    if UNPACK == 2:
        qs1 = qs1 * 4.0
        qs2 = qs2 * 16.0
        qs3 = qs3 * 64.0
    return qc0, qc1, qc2, qc3, qs0, qs1, qs2, qs3


@triton.jit
def _int2_scale(a0, a1, a2, a3, UNPACK: tl.constexpr):
    """The inverse of ``_int2_unscale``: accumulators that already hold BF16-row sums, into
    the scaled units of an INT2 loop that follows (extend: the INT2 pages come last)."""
    if UNPACK == 2:
        a0 = a0 * TWO_M24
        a1 = a1 * (TWO_M24 * 4)
        a2 = a2 * (TWO_M24 * 16)
        a3 = a3 * (TWO_M24 * 64)
    return a0, a1, a2, a3


@triton.jit
def _int2_unscale(a0, a1, a2, a3, UNPACK: tl.constexpr):
    """Value accumulators of an INT2 loop back to code units (``UNPACK == 2``: quarter ``i``
    was accumulated in units of ``4^i · 2^-24``; exact power-of-two products)."""
    if UNPACK == 2:
        a0 = a0 * TWO_24
        a1 = a1 * (TWO_24 / 4)
        a2 = a2 * (TWO_24 / 16)
        a3 = a3 * (TWO_24 / 64)
    return a0, a1, a2, a3


@triton.jit
def _int2_block(q0, q1, q2, q3, qs0, qs1, qs2, qs3,
                k_codes, v_codes, cbase, k_params, v_params, pbase, nmask, valid,
                m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3,
                PD: tl.constexpr, NG: tl.constexpr, DOT16: tl.constexpr,
                UNPACK: tl.constexpr):
    """Attend one block of ``N`` INT2 tokens.

    ``q0..q3 [M, PD]`` from ``_int2_query`` (dot dtype), ``qs0..qs3 [M]`` fp32 quarter sums;
    ``cbase``/``pbase [N]`` int64 element offsets of each token's codes/params row;
    ``nmask [N]`` loadable tokens; ``valid [M, N]`` visible (query, token) pairs. With
    ``UNPACK == 2`` the returned ``a0..a3`` are in the scaled units that ``_int2_unscale``
    undoes (scores and ``z`` are not scaled).
    """
    KSCALE: tl.constexpr = TWO_24 if UNPACK == 2 else 1.0
    j = tl.arange(0, PD)
    kraw = tl.load(k_codes + cbase[:, None] + j[None, :], mask=nmask[:, None], other=0)
    ks0 = tl.load(k_params + pbase, mask=nmask, other=0.0).to(tl.float32) * KSCALE
    kz0 = tl.load(k_params + pbase + 1, mask=nmask, other=0.0).to(tl.float32)
    k0 = tl.trans(_codes_quarter(kraw, 0, DOT16, UNPACK))
    k1 = tl.trans(_codes_quarter(kraw, 1, DOT16, UNPACK))
    k2 = tl.trans(_codes_quarter(kraw, 2, DOT16, UNPACK))
    k3 = tl.trans(_codes_quarter(kraw, 3, DOT16, UNPACK))
    if NG == 1:
        # one accumulator chained through the four quarter dots
        d = _dot_acc(q3, k3, _dot_acc(q2, k2, _dot_acc(q1, k1, _dot(q0, k0, DOT16), DOT16),
                                      DOT16), DOT16)
        s = ks0[None, :] * d + kz0[None, :] * (qs0 + qs1 + qs2 + qs3)[:, None]
    elif NG == 2:
        ks1 = tl.load(k_params + pbase + 2, mask=nmask, other=0.0).to(tl.float32) * KSCALE
        kz1 = tl.load(k_params + pbase + 3, mask=nmask, other=0.0).to(tl.float32)
        d01 = _dot_acc(q1, k1, _dot(q0, k0, DOT16), DOT16)
        d23 = _dot_acc(q3, k3, _dot(q2, k2, DOT16), DOT16)
        s = (ks0[None, :] * d01 + ks1[None, :] * d23
             + kz0[None, :] * (qs0 + qs1)[:, None] + kz1[None, :] * (qs2 + qs3)[:, None])
    else:
        ks1 = tl.load(k_params + pbase + 2, mask=nmask, other=0.0).to(tl.float32) * KSCALE
        kz1 = tl.load(k_params + pbase + 3, mask=nmask, other=0.0).to(tl.float32)
        ks2 = tl.load(k_params + pbase + 4, mask=nmask, other=0.0).to(tl.float32) * KSCALE
        kz2 = tl.load(k_params + pbase + 5, mask=nmask, other=0.0).to(tl.float32)
        ks3 = tl.load(k_params + pbase + 6, mask=nmask, other=0.0).to(tl.float32) * KSCALE
        kz3 = tl.load(k_params + pbase + 7, mask=nmask, other=0.0).to(tl.float32)
        d0 = _dot(q0, k0, DOT16)
        d1 = _dot(q1, k1, DOT16)
        d2 = _dot(q2, k2, DOT16)
        d3 = _dot(q3, k3, DOT16)
        s = (ks0[None, :] * d0 + ks1[None, :] * d1 + ks2[None, :] * d2 + ks3[None, :] * d3
             + kz0[None, :] * qs0[:, None] + kz1[None, :] * qs1[:, None]
             + kz2[None, :] * qs2[:, None] + kz3[None, :] * qs3[:, None])
    s = tl.where(valid, s, float("-inf"))
    p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i)

    vraw = tl.load(v_codes + cbase[:, None] + j[None, :], mask=nmask[:, None], other=0)
    vs0 = tl.load(v_params + pbase, mask=nmask, other=0.0).to(tl.float32)
    vz0 = tl.load(v_params + pbase + 1, mask=nmask, other=0.0).to(tl.float32)
    v0 = _codes_quarter(vraw, 0, DOT16, UNPACK)
    v1 = _codes_quarter(vraw, 1, DOT16, UNPACK)
    v2 = _codes_quarter(vraw, 2, DOT16, UNPACK)
    v3 = _codes_quarter(vraw, 3, DOT16, UNPACK)
    a0 = a0 * alpha[:, None]
    a1 = a1 * alpha[:, None]
    a2 = a2 * alpha[:, None]
    a3 = a3 * alpha[:, None]
    if NG == 1:
        pv0 = (p * vs0[None, :]).to(v0.dtype)
        a0 += _dot(pv0, v0, DOT16)
        a1 += _dot(pv0, v1, DOT16)
        a2 += _dot(pv0, v2, DOT16)
        a3 += _dot(pv0, v3, DOT16)
        zs0 = tl.sum(p * vz0[None, :], axis=1)
        zs1 = zs0
        zs2 = zs0
        zs3 = zs0
    elif NG == 2:
        vs1 = tl.load(v_params + pbase + 2, mask=nmask, other=0.0).to(tl.float32)
        vz1 = tl.load(v_params + pbase + 3, mask=nmask, other=0.0).to(tl.float32)
        pv0 = (p * vs0[None, :]).to(v0.dtype)
        pv1 = (p * vs1[None, :]).to(v0.dtype)
        a0 += _dot(pv0, v0, DOT16)
        a1 += _dot(pv0, v1, DOT16)
        a2 += _dot(pv1, v2, DOT16)
        a3 += _dot(pv1, v3, DOT16)
        zs0 = tl.sum(p * vz0[None, :], axis=1)
        zs1 = zs0
        zs2 = tl.sum(p * vz1[None, :], axis=1)
        zs3 = zs2
    else:
        vs1 = tl.load(v_params + pbase + 2, mask=nmask, other=0.0).to(tl.float32)
        vz1 = tl.load(v_params + pbase + 3, mask=nmask, other=0.0).to(tl.float32)
        vs2 = tl.load(v_params + pbase + 4, mask=nmask, other=0.0).to(tl.float32)
        vz2 = tl.load(v_params + pbase + 5, mask=nmask, other=0.0).to(tl.float32)
        vs3 = tl.load(v_params + pbase + 6, mask=nmask, other=0.0).to(tl.float32)
        vz3 = tl.load(v_params + pbase + 7, mask=nmask, other=0.0).to(tl.float32)
        a0 += _dot((p * vs0[None, :]).to(v0.dtype), v0, DOT16)
        a1 += _dot((p * vs1[None, :]).to(v0.dtype), v1, DOT16)
        a2 += _dot((p * vs2[None, :]).to(v0.dtype), v2, DOT16)
        a3 += _dot((p * vs3[None, :]).to(v0.dtype), v3, DOT16)
        zs0 = tl.sum(p * vz0[None, :], axis=1)
        zs1 = tl.sum(p * vz1[None, :], axis=1)
        zs2 = tl.sum(p * vz2[None, :], axis=1)
        zs3 = tl.sum(p * vz3[None, :], axis=1)
    z0 = z0 * alpha + zs0
    z1 = z1 * alpha + zs1
    z2 = z2 * alpha + zs2
    z3 = z3 * alpha + zs3
    return m_i, l_i, a0, a1, a2, a3, z0, z1, z2, z3


@triton.jit
def _join4(x0, x1, x2, x3):
    """Quarter tiles ``[R, PD]`` → one ``[R, 4·PD]`` tile, column ``4j + 2x + y`` holding
    quarter ``2y + x``'s column ``j`` (a fixed permutation of the channels: dots of two
    tiles joined alike are the channel sums). ``_split4`` undoes it."""
    j = tl.join(tl.join(x0, x1), tl.join(x2, x3))                     # [R, PD, 2, 2]
    return tl.reshape(j, [x0.shape[0], 4 * x0.shape[1]])


@triton.jit
def _split4(x, PD: tl.constexpr):
    """The inverse of ``_join4``: ``[R, 4·PD]`` → four ``[R, PD]`` quarter tiles."""
    lo, hi = tl.split(tl.reshape(x, [x.shape[0], PD, 2, 2]))
    x0, x1 = tl.split(lo)
    x2, x3 = tl.split(hi)
    return x0, x1, x2, x3


@triton.jit
def _int2_block_whole(qj, qsum, acc, z, k_codes, v_codes, cbase, k_params, v_params, pbase,
                      nmask, valid, m_i, l_i, PD: tl.constexpr, DOT16: tl.constexpr,
                      UNPACK: tl.constexpr):
    """``_int2_block`` for one scale/zero group per token (``NG == 1``) with whole-row dots:
    the four code quarters joined into one ``[N, D]`` operand (``_join4``) so that QK is
    one dot over ``D`` channels and PV one dot of ``D`` columns (instead of four of
    ``D/4``). ``qj [M, D]`` the query quarters from ``_int2_query`` joined the same way,
    ``qsum [M]`` their unscaled sum, ``acc [M, D]`` in the joined order (and in the scaled
    units of ``UNPACK == 2``: ``_split4`` then ``_int2_unscale`` after the loop)."""
    KSCALE: tl.constexpr = TWO_24 if UNPACK == 2 else 1.0
    j = tl.arange(0, PD)
    kraw = tl.load(k_codes + cbase[:, None] + j[None, :], mask=nmask[:, None], other=0)
    ks = tl.load(k_params + pbase, mask=nmask, other=0.0).to(tl.float32) * KSCALE
    kz = tl.load(k_params + pbase + 1, mask=nmask, other=0.0).to(tl.float32)
    kj = _join4(_codes_quarter(kraw, 0, DOT16, UNPACK), _codes_quarter(kraw, 1, DOT16, UNPACK),
                _codes_quarter(kraw, 2, DOT16, UNPACK), _codes_quarter(kraw, 3, DOT16, UNPACK))
    s = ks[None, :] * _dot(qj, tl.trans(kj), DOT16) + kz[None, :] * qsum[:, None]
    s = tl.where(valid, s, float("-inf"))
    p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i)
    vraw = tl.load(v_codes + cbase[:, None] + j[None, :], mask=nmask[:, None], other=0)
    vs = tl.load(v_params + pbase, mask=nmask, other=0.0).to(tl.float32)
    vz = tl.load(v_params + pbase + 1, mask=nmask, other=0.0).to(tl.float32)
    vj = _join4(_codes_quarter(vraw, 0, DOT16, UNPACK), _codes_quarter(vraw, 1, DOT16, UNPACK),
                _codes_quarter(vraw, 2, DOT16, UNPACK), _codes_quarter(vraw, 3, DOT16, UNPACK))
    acc = _dot_acc((p * vs[None, :]).to(vj.dtype), vj, acc * alpha[:, None], DOT16)
    z = z * alpha + tl.sum(p * vz[None, :], axis=1)
    return m_i, l_i, acc, z


@triton.jit
def _bf16_block(q0, q1, q2, q3, k_rows, v_rows, rbase, nmask, valid,
                m_i, l_i, a0, a1, a2, a3,
                PD: tl.constexpr, DOT16: tl.constexpr):
    """Attend one block of ``N`` BF16 rows (window rows or a chunk's own rotated rows).

    ``q0..q3 [M, PD]`` fp32; ``rbase [N]`` int64 element offsets of each row in both
    ``k_rows`` and ``v_rows``; ``nmask [N]``; ``valid [M, N]``.
    """
    j = tl.arange(0, PD)
    kp = k_rows + rbase[:, None] + j[None, :]
    k0 = tl.load(kp, mask=nmask[:, None], other=0.0).to(tl.float32)
    k1 = tl.load(kp + PD, mask=nmask[:, None], other=0.0).to(tl.float32)
    k2 = tl.load(kp + 2 * PD, mask=nmask[:, None], other=0.0).to(tl.float32)
    k3 = tl.load(kp + 3 * PD, mask=nmask[:, None], other=0.0).to(tl.float32)
    s = (_dot_f32(q0, tl.trans(k0), DOT16) + _dot_f32(q1, tl.trans(k1), DOT16)
         + _dot_f32(q2, tl.trans(k2), DOT16) + _dot_f32(q3, tl.trans(k3), DOT16))
    s = tl.where(valid, s, float("-inf"))
    p, alpha, m_i, l_i = _softmax_update(s, m_i, l_i)
    vp = v_rows + rbase[:, None] + j[None, :]
    v0 = tl.load(vp, mask=nmask[:, None], other=0.0).to(tl.float32)
    v1 = tl.load(vp + PD, mask=nmask[:, None], other=0.0).to(tl.float32)
    v2 = tl.load(vp + 2 * PD, mask=nmask[:, None], other=0.0).to(tl.float32)
    v3 = tl.load(vp + 3 * PD, mask=nmask[:, None], other=0.0).to(tl.float32)
    a0 = a0 * alpha[:, None] + _dot_f32(p, v0, DOT16)
    a1 = a1 * alpha[:, None] + _dot_f32(p, v1, DOT16)
    a2 = a2 * alpha[:, None] + _dot_f32(p, v2, DOT16)
    a3 = a3 * alpha[:, None] + _dot_f32(p, v3, DOT16)
    return m_i, l_i, a0, a1, a2, a3


@triton.jit
def _unrotate(o0, o1, o2, o3, rot_base, stride_rd, stride_rc, D: tl.constexpr,
              PD: tl.constexpr, DOT16: tl.constexpr):
    """``o' @ R^T`` from the quarters ``o0..o3 [M, PD]`` (fp32, rotated space) → ``[M, D]``.

    ``R [D, D]`` fp32 at ``rot_base`` (strides ``stride_rd``, ``stride_rc``); quarter ``i``
    multiplies rows ``[i·PD, (i+1)·PD)`` of ``R^T``. TF32 on the GPU (11-bit operands, finer
    than the bf16 output it feeds; 3xTF32 spilled registers at ``maxnreg=128``), IEEE in
    the interpreter.
    """
    k = tl.arange(0, PD)
    c = tl.arange(0, D)
    rt = rot_base + c[None, :] * stride_rd + k[:, None] * stride_rc       # R^T rows [PD, D]
    if DOT16:
        out = tl.dot(o0, tl.load(rt), input_precision="tf32")
        out = tl.dot(o1, tl.load(rt + PD * stride_rc), out, input_precision="tf32")
        out = tl.dot(o2, tl.load(rt + 2 * PD * stride_rc), out, input_precision="tf32")
        out = tl.dot(o3, tl.load(rt + 3 * PD * stride_rc), out, input_precision="tf32")
    else:
        out = tl.dot(o0, tl.load(rt), input_precision="ieee")
        out = tl.dot(o1, tl.load(rt + PD * stride_rc), out, input_precision="ieee")
        out = tl.dot(o2, tl.load(rt + 2 * PD * stride_rc), out, input_precision="ieee")
        out = tl.dot(o3, tl.load(rt + 3 * PD * stride_rc), out, input_precision="ieee")
    return out


@triton.jit
def _rotate_quarter(q_rows, rmask, rot_base, stride_rd, stride_rc, I: tl.constexpr,
                    D: tl.constexpr, PD: tl.constexpr, PREC: tl.constexpr):
    """Quarter ``I`` of ``x @ R``: ``Σ_c x[:, c-th quarter] @ R[c-th quarter, I-th quarter]``.

    ``q_rows [M]`` pointers to the rows of ``x`` (any float dtype, upcast to fp32), ``R``
    ``[D, D]`` fp32 at ``rot_base`` with strides ``(stride_rd, stride_rc)``. Four
    ``[M, D/4] x [D/4, D/4]`` dots in ``PREC``: ``"tf32x3"`` (split-precision tensor-core
    products, about fp32 accuracy; extend) or ``"tf32"`` (decode: operands rounded to 11
    bits, as its INT2 dots round the result to fp16 anyway; with 3xTF32 the prologue
    spilled 264 B at ``maxnreg=168`` and 576 B at 128, with TF32 nothing; CPU ptxas,
    sm_90a, 2026-11-29). An IEEE (FMA) dot here made ptxas fall back to 32 registers and
    a 3.5 KB spill stack. In the interpreter every precision is IEEE.
    """
    j = tl.arange(0, PD)
    acc = tl.zeros([q_rows.shape[0], PD], tl.float32)
    for c in tl.static_range(4):
        x = tl.load(q_rows[:, None] + (c * PD + j)[None, :], mask=rmask[:, None],
                    other=0.0).to(tl.float32)
        r = tl.load(rot_base + (c * PD + j)[:, None] * stride_rd
                    + (I * PD + j)[None, :] * stride_rc)
        acc += tl.dot(x, r, input_precision=PREC)
    return acc
