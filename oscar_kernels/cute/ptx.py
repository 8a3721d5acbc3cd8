"""Inline-PTX wrappers and register-format constants of the CuTe decode kernels.

Each wrapper is one PTX instruction (or a short predicated sequence) the DSL has no
primitive for, written with ``cute.arch.inline_ptx``: global / shared loads and stores,
``cp.async`` with zero fill, ``mma.sync`` (fp16 / bf16 ``m16n8k16``, u8 x s8
``m16n8k32``), ``ldmatrix``, shuffles, fast math, fences and atomics. They trace into the
kernel that calls them; nothing here launches anything.
"""

from __future__ import annotations

import math

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64


def _ptx(code, outs, ins):
    return cute.arch.inline_ptx(code, write_only_types=outs, read_only_args=ins)


def _ldg_b32(addr):
    return _ptx("ld.global.nc.L1::no_allocate.b32 {$w0}, [{$r0}];", [Int32], [addr])


def _ldg_v2(addr):
    return _ptx("ld.global.nc.L1::no_allocate.v2.b32 {{$w0}, {$w1}}, [{$r0}];", [Int32, Int32],
                [addr])


def _ldg_v4(addr):
    return _ptx("ld.global.nc.L1::no_allocate.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                [Int32] * 4, [addr])


def _ldg_s32(addr):
    return _ptx("ld.global.b32 {$w0}, [{$r0}];", [Int32], [addr])


def _stg_f32(addr, val):
    _ptx("st.global.f32 [{$r0}], {$r1};", [], [addr, val])


def _prmt(a, b, sel: int):
    return _ptx(f"prmt.b32 {{$w0}}, {{$r0}}, {{$r1}}, {hex(sel)};", [Int32], [a, b])


def _f16x2_to_f32(word):
    return _ptx("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, {$r0}; cvt.f32.f16 {$w0}, lo; "
                "cvt.f32.f16 {$w1}, hi; }", [Float32, Float32], [word])


def _bf16x2_to_f32(word):
    return _ptx("{ .reg .b32 t; shl.b32 t, {$r0}, 16; mov.b32 {$w0}, t; "
                "and.b32 t, {$r0}, 0xffff0000; mov.b32 {$w1}, t; }", [Float32, Float32], [word])


def _pack_bf16x2(lo, hi):
    return _ptx("cvt.rn.bf16x2.f32 {$w0}, {$r1}, {$r0};", [Int32], [lo, hi])


def _sel_f32(flag, a, b):
    """``a if flag != 0 else b`` (flag an Int32)."""
    return _ptx("{ .reg .pred p; setp.ne.s32 p, {$r2}, 0; selp.f32 {$w0}, {$r0}, {$r1}, p; }",
                [Float32], [a, b, flag])


def _fmax(a, b):
    return _ptx("max.f32 {$w0}, {$r0}, {$r1};", [Float32], [a, b])


def _ex2(x):
    return _ptx("ex2.approx.ftz.f32 {$w0}, {$r0};", [Float32], [x])


def _lg2(x):
    return _ptx("lg2.approx.f32 {$w0}, {$r0};", [Float32], [x])


def _fabs(x):
    return _ptx("abs.f32 {$w0}, {$r0};", [Float32], [x])


def _rcp_exact(x):
    return _ptx("rcp.rn.f32 {$w0}, {$r0};", [Float32], [x])


def _rcp(x):
    return _ptx("rcp.approx.f32 {$w0}, {$r0};", [Float32], [x])


def _pack_f16x2(lo, hi):
    return _ptx("cvt.rn.f16x2.f32 {$w0}, {$r1}, {$r0};", [Int32], [lo, hi])


def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, f16: bool = False):
    t = "f16" if f16 else "bf16"
    return _ptx(f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 "
                "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, "
                "{{$r6}, {$r7}, {$r8}, {$r9}};", [Float32] * 4,
                [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3])


def _mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma.sync.m16n8k32`` u8 x s8 -> s32 (IMMA)."""
    return _ptx("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
                "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, "
                "{{$r6}, {$r7}, {$r8}, {$r9}};", [Int32] * 4,
                [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3])


def _ldsm_x2_trans(addr):
    """Two 8x8 16-bit tiles (rows from lanes 0-15), transposed: ``ldmatrix .x2 .trans``."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{$w0}, {$w1}}, [{$r0}];",
                [Int32, Int32], [addr])


def _ldsm_x2(addr):
    """Two 8x8 16-bit tiles (rows from lanes 0-15): ``ldmatrix .x2``."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{$w0}, {$w1}}, [{$r0}];",
                [Int32, Int32], [addr])


def _ldsm_x4(addr):
    """Four 8x8 16-bit tiles (row addresses from lanes 0-31): ``ldmatrix .x4``."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{$w0}, {$w1}, {$w2}, {$w3}}, "
                "[{$r0}];", [Int32] * 4, [addr])


def _ldsm_x4_trans(addr):
    """Four 8x8 16-bit tiles (row addresses from lanes 0-31), transposed."""
    return _ptx("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{$w0}, {$w1}, {$w2}, {$w3}}, "
                "[{$r0}];", [Int32] * 4, [addr])


def _mul_u32(x, k: int):
    """``x * k`` (mul.lo: ptxas may issue it as IMAD on the FMA pipe)."""
    return _ptx(f"mul.lo.u32 {{$w0}}, {{$r0}}, {k};", [Int32], [x])


def _mad_s32(x, k: int, y):
    return _ptx(f"mad.lo.s32 {{$w0}}, {{$r0}}, {k}, {{$r1}};", [Int32], [x, y])


def _i2f(x):
    return _ptx("cvt.rn.f32.s32 {$w0}, {$r0};", [Float32], [x])


def _f2i_rn(x):
    return _ptx("cvt.rni.s32.f32 {$w0}, {$r0};", [Int32], [x])


def _pack_s8x4(x0, x1, x2, x3):
    """Low bytes of four Int32 -> one b32 (x0 in byte 0)."""
    t01 = _prmt(x0, x1, 0x0040)
    t23 = _prmt(x2, x3, 0x0040)
    return _prmt(t01, t23, 0x5410)


def _shfl_bfly(x, m):
    return cute.arch.shuffle_sync_bfly(x, offset=m)


def _shfl_idx(x, src):
    return cute.arch.shuffle_sync(x, offset=src)


NEG_INF = -math.inf
#: Initial running max: finite, so that exp2(score - max) needs no -inf guard (masked scores
#: are -inf and give 0; the first real score replaces it and rescales zeros).
M_INIT = -1.0e30
#: Smallest normal float32.
FLT_MIN = 2.0 ** -126
#: INT2 operands are fp16 *subnormals*: the 2-bit field of channel quarter i sits at bits
#: 2i of a code byte, and ``w & mask_i`` read as an fp16 pair is ``m_i * code * 2^-24``
#: exactly (subnormal fp16 = mantissa * 2^-24; the tensor cores take subnormal inputs). One
#: ``and`` per pair, no offset to remove; the 2^-24 is folded into the score scale and the
#: output normalization.
SUBNORMAL = 2.0 ** -24
#: Multiplier of the code of channel quarter i after the unpack (its field sits at mantissa
#: bits 2i of the fp16 value).
QUARTER_MULT = (1.0, 4.0, 16.0, 64.0)
QUARTER_MASK = (0x00030003, 0x000C000C, 0x00300030, 0x00C000C0)


def _and_mask(x, mask: int):
    """``x & mask``: an fp16 pair ``m * code * 2^-24`` (subnormals; one LOP3)."""
    return _ptx(f"and.b32 {{$w0}}, {{$r0}}, {hex(mask)};", [Int32], [x])


def _shr(x, n: int):
    return _ptx(f"shr.u32 {{$w0}}, {{$r0}}, {n};", [Int32], [x])


def _mul_bf16x2(x, m: float):
    if m == 1.0:
        return x
    bits = {4.0: 0x40804080, 16.0: 0x41804180, 64.0: 0x42804280}[m]
    return _ptx(f"{{ .reg .b32 c; mov.b32 c, {hex(bits)}; mul.rn.bf16x2 {{$w0}}, {{$r0}}, c; }}",
                [Int32], [x])


def _mul_f16x2(a, b):
    return _ptx("mul.rn.f16x2 {$w0}, {$r0}, {$r1};", [Int32], [a, b])


def _f16hi_to_f32(word):
    return _ptx("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, {$r0}; cvt.f32.f16 {$w0}, hi; }",
                [Float32], [word])


def _mad_wide_u32(a, b: int, c):
    """``c + (u64) a * b`` (a: Int32 read as unsigned, c: Int64)."""
    return _ptx(f"mad.wide.u32 {{$w0}}, {{$r0}}, {b}, {{$r1}};", [Int64], [a, c])


def _cp_async16_if(c, n, smem_addr, gaddr):
    """16-byte cp.async of which nothing is read unless ``c < n`` (src-size 0: the stage
    bytes are zero-filled, no global access; no predicate, no branch)."""
    _ptx("{ .reg .pred p; .reg .b32 sz; setp.lt.s32 p, {$r0}, {$r1}; selp.b32 sz, 16, 0, p; "
         "cp.async.cg.shared.global [{$r2}], [{$r3}], 16, sz; }", [], [c, n, smem_addr, gaddr])


def _cp_async4_if(c, n, smem_addr, gaddr):
    _ptx("{ .reg .pred p; .reg .b32 sz; setp.lt.s32 p, {$r0}, {$r1}; selp.b32 sz, 4, 0, p; "
         "cp.async.ca.shared.global [{$r2}], [{$r3}], 4, sz; }", [], [c, n, smem_addr, gaddr])


def _udiv_rcp(x, d, inv):
    """``floor(x / d)`` for ``0 <= x < 2^24``, ``d >= 1``, ``inv = 1 / d`` (float): the
    truncated product and one correction each way."""
    return _ptx("{ .reg .f32 f; .reg .s32 q, r; .reg .pred p; cvt.rn.f32.s32 f, {$r0}; "
                "mul.f32 f, f, {$r2}; cvt.rzi.s32.f32 q, f; mul.lo.s32 r, q, {$r1}; "
                "sub.s32 r, {$r0}, r; setp.ge.s32 p, r, {$r1}; @p add.s32 q, q, 1; "
                "setp.lt.s32 p, r, 0; @p sub.s32 q, q, 1; mov.b32 {$w0}, q; }",
                [Int32], [x, d, inv])


def _ldg_s32_if(addr, flag):
    """``*addr`` when ``flag`` != 0, else 0 (predicated load, no branch)."""
    return _ptx("{ .reg .pred p; setp.ne.s32 p, {$r1}, 0; mov.b32 {$w0}, 0; "
                "@p ld.global.s32 {$w0}, [{$r0}]; }", [Int32], [addr, flag])


def _cp_commit():
    _ptx("cp.async.commit_group;", [], [])


def _cp_wait(n: int):
    _ptx(f"cp.async.wait_group {n};", [], [])


def _syncwarp():
    _ptx("bar.warp.sync 0xffffffff;", [], [])


def _lds_b32(addr):
    return _ptx("ld.shared.b32 {$w0}, [{$r0}];", [Int32], [addr])


def _lds_v2(addr):
    return _ptx("ld.shared.v2.b32 {{$w0}, {$w1}}, [{$r0}];", [Int32, Int32], [addr])


def _lds_v2f(addr):
    return _ptx("ld.shared.v2.f32 {{$w0}, {$w1}}, [{$r0}];", [Float32, Float32], [addr])


def _f32_bits(x):
    return _ptx("mov.b32 {$w0}, {$r0};", [Int32], [x])


def _bits_f32(x):
    return _ptx("mov.b32 {$w0}, {$r0};", [Float32], [x])


def _ldg_f32(addr):
    return _ptx("ld.global.f32 {$w0}, [{$r0}];", [Float32], [addr])


def _ldcg_f32(addr):
    """Load through L2 only (data written by other CTAs of this launch)."""
    return _ptx("ld.global.cg.f32 {$w0}, [{$r0}];", [Float32], [addr])


def _prefetch_l2(addr):
    _ptx("prefetch.global.L2 [{$r0}];", [], [addr])


def _fence_acq_rel_gpu():
    _ptx("fence.acq_rel.gpu;", [], [])


def _counter_addr(counter_ptr, b, h, num_kv_heads):
    """Address of the ticket / count of (sequence ``b``, KV head ``h``)."""
    return counter_ptr + (Int64(b) * Int64(num_kv_heads) + Int64(h)) * 4


def _ld_relaxed_s32(addr):
    return _ptx("ld.relaxed.gpu.global.s32 {$w0}, [{$r0}];", [Int32], [addr])


def _nanosleep(ns: int):
    _ptx(f"nanosleep.u32 {ns};", [], [])


def _atom_add_s32(addr, val: int):
    return _ptx(f"atom.global.add.s32 {{$w0}}, [{{$r0}}], {val};", [Int32], [addr])


def _stg_s32(addr, val: int):
    _ptx(f"st.global.b32 [{{$r0}}], {val};", [], [addr])


def _sts_i32(addr, val):
    _ptx("st.shared.b32 [{$r0}], {$r1};", [], [addr, val])


def _sts_b16_of_f32(addr, val):
    """Store ``val`` rounded to bf16 into shared memory."""
    _ptx("{ .reg .b16 t; cvt.rn.bf16.f32 t, {$r1}; st.shared.b16 [{$r0}], t; }", [],
         [addr, val])


def _ldg_kind(addr4, addr2, kind):
    """Load one element as float32: ``kind`` 0 float32 at ``addr4``, 1 bf16 / 2 fp16 at
    ``addr2`` (predicated loads, no branch)."""
    return _ptx("{ .reg .pred p0, p1; .reg .b16 t; .reg .f32 a, x, y; "
                "setp.eq.s32 p0, {$r2}, 0; setp.eq.s32 p1, {$r2}, 1; "
                "mov.f32 a, 0f00000000; mov.b16 t, 0; "
                "@p0 ld.global.nc.f32 a, [{$r0}]; @!p0 ld.global.nc.b16 t, [{$r1}]; "
                "cvt.f32.bf16 x, t; cvt.f32.f16 y, t; selp.f32 y, x, y, p1; "
                "selp.f32 {$w0}, a, y, p0; }", [Float32], [addr4, addr2, kind])


def _store_kind(base, idx, val, kind):
    """Store ``val`` at element ``idx`` of ``base``: ``kind`` 0 float32, 1 bf16, 2 fp16."""
    _ptx("{ .reg .pred p0, p1, p2; .reg .b16 t, u; "
         "setp.eq.s32 p0, {$r3}, 0; setp.eq.s32 p1, {$r3}, 1; setp.eq.s32 p2, {$r3}, 2; "
         "cvt.rn.bf16.f32 t, {$r2}; cvt.rn.f16.f32 u, {$r2}; "
         "@p0 st.global.f32 [{$r0}], {$r2}; @p1 st.global.b16 [{$r1}], t; "
         "@p2 st.global.b16 [{$r1}], u; }", [], [base + idx * 4, base + idx * 2, val, kind])


def _sts_f32(addr, val):
    _ptx("st.shared.f32 [{$r0}], {$r1};", [], [addr, val])


def _lds_f32(addr):
    return _ptx("ld.shared.f32 {$w0}, [{$r0}];", [Float32], [addr])
