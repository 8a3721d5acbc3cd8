"""INT2 paged decode attention for Hopper (sm_90a), written in the CuTe Python DSL.

What it computes
----------------
One query per sequence over the mixed INT2/BF16 paged cache of docs/format.md, in the
rotated space: for every (sequence ``b``, KV head ``h``, query head ``g`` of the group)

    score_t = s_t * (q'_g . code_t) + z_t * sum(q'_g)        (INT2 token: scale s_t, zero z_t)
    score_t = q'_g . k'_t                                     (BF16 sink/recent token)
    o'_g    = sum_t p_t s^v_t code^v_t + (sum_t p_t z^v_t) * 1   (+ BF16 tokens: p_t v'_t)

split over KV (grid ``(num_splits, num_kv_heads, batch_size)``, 4 warps per CTA, each warp
one independent split of 16-token chunks). Each warp writes a normalized partial output
and its base-2 log-sum-exp; :func:`oscar_kernels.cute.decode` merges the partials and
applies ``o @ R_V^T`` (torch, graph-safe, no host sync). ``q' = q @ R_K`` is a torch matmul
before the launch.

Tensor cores: both products use ``mma.sync.m16n8k16`` (HMMA, bf16 in, fp32 accumulate).
QK is ``S = Q K^T`` with the query heads of one KV head as the M rows (padded to 16) and 8
tokens per N tile; PV is ``O^T = V^T P^T`` with the head dim as M and the same 16 tokens as
K, so the QK accumulator fragment is exactly the PV B fragment (no shuffles, no smem).

Dequantization is folded per token (scale/zero applied to the fp32 scores and folded into
``P``), so codes go to the tensor cores as exact small integers. 2-bit -> bf16 conversion is
two instructions per pair of values: ``lop3((w >> 2i) & 0x00030003 | 0x43004300)`` makes
the bf16 pair ``128 + code`` and one ``sub.bf16x2`` removes the 128 (no int->float
instructions). Because the byte layout puts channels ``j, j + D/4, j + D/2, j + 3D/4`` in
one byte, the MMA K (resp. M) index is a fixed permutation of the channels: the kernel
loads the query (and writes the output) through the same permutation, so codes are used
as loaded (8 bytes per token and thread for K, a 4-byte word for V, ``prmt`` interleaves
two tokens for the V operand).

Memory: plain ``ld.global.nc`` vector loads straight into registers (no TMA, no cp.async,
no smem pipeline in this version; latency hiding comes from occupancy and the split over
many warps). A 16-token chunk lies inside one page (``page_size % 16 == 0``), so there is
one page-table lookup per chunk.

Constraints (``can_implement`` in oscar_kernels/cute/__init__.py enforces them):
``head_dim`` in {64, 128}; ``group_size == head_dim`` (one scale/zero per token and head);
fp16 scales; ``page_size % 16 == 0``; GQA ratio 1..8; NHD or HND pages; q bf16/fp16/fp32
(rotated to bf16 before the kernel); sm_90 only.

Static compile key: ``head_dim`` only; batch, heads, page size, strides, GQA ratio,
sink/recent sizes and the number of splits are runtime arguments, so one specialization per
head_dim serves every config (the ahead-of-time bundle holds two kernels).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

#: Warps per CTA; every warp is an independent KV split.
NUM_WARPS = 4
#: Tokens per chunk (two 8-token QK N tiles = one 16-token PV K step).
CHUNK = 16


@dataclass(frozen=True)
class Int2DecodeConfig:
    """Static compile key of :class:`Int2PagedDecodeSm90`."""

    head_dim: int

    @property
    def name(self) -> str:
        return f"int2_decode_sm90_d{self.head_dim}"


# ------------------------------------------------------------------ PTX helpers
def _ptx(code, outs, ins):
    return cute.arch.inline_ptx(code, write_only_types=outs, read_only_args=ins)


def _ldg_b32(addr):
    return _ptx("ld.global.nc.L1::no_allocate.b32 {$w0}, [{$r0}];", [Int32], [addr])


def _ldg_b16(addr):
    return _ptx("{ .reg .b16 t; ld.global.nc.L1::no_allocate.b16 t, [{$r0}]; cvt.u32.u16 {$w0}, t; }",
                [Int32], [addr])


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


def _unpack2(word, shift: int):
    """bf16x2 of the 2-bit fields at bits ``shift`` and ``shift + 16`` of ``word`` (exact)."""
    return _ptx("{ .reg .b32 t, c; mov.b32 c, 0x43004300; "
                f"shr.b32 t, {{$r0}}, {shift}; lop3.b32 t, t, 0x00030003, c, 0xEA; "
                "sub.rn.bf16x2 {$w0}, t, c; }", [Int32], [word])


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


def _rcp(x):
    return _ptx("rcp.approx.f32 {$w0}, {$r0};", [Float32], [x])


def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _ptx("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, "
                "{{$r6}, {$r7}, {$r8}, {$r9}};", [Float32] * 4,
                [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3])


def _shfl_bfly(x, m):
    return cute.arch.shuffle_sync_bfly(x, offset=m)


def _shfl_idx(x, src):
    return cute.arch.shuffle_sync(x, offset=src)


NEG_INF = -math.inf


class Int2PagedDecodeSm90:
    """Split-KV INT2/BF16 paged decode attention, one specialization per ``head_dim``.

    Per thread (lane = 4 * ``g`` + ``quad``): query head ``g`` of the GQA group for QK rows,
    tokens ``g`` and ``g + 8`` of a chunk for K codes, tokens ``2 quad + {0, 1, 8, 9}`` for
    scores, V codes and all scale/zero pairs. Channel permutations:

    * QK K index ``16 s + 2 quad + j + 8 half`` is channel
      ``quad * D/16 + 4 (r // 8) + r % 2 + 2 j + ((r % 8) // 2) * D/4`` with ``r = 2 s + half``;
    * PV M row ``16 mt + g + 8 rh`` is channel ``g * D/32 + 2 (mt // 4) + rh + (mt % 4) * D/4``.
    """

    def __init__(self, config: Int2DecodeConfig):
        d = config.head_dim
        if d not in (64, 128):
            raise ValueError(f"head_dim: expected 64 or 128, got {d}")
        self.config = config
        self.d = d
        self.ksteps = d // 16          # QK K steps
        self.mtiles = d // 16          # PV M tiles
        self.nbk = d // 16             # K-code bytes per thread and token
        self.nbv = d // 32             # V-code bytes per thread and token

    # ---------------------------------------------------------- channel maps
    def qk_channel(self, s: int, half: int, j: int, quad):
        r = 2 * s + half
        return (quad * self.nbk + 4 * (r // 8) + r % 2 + 2 * j + ((r % 8) // 2) * (self.d // 4))

    def pv_channel(self, mt: int, rh: int, g):
        return g * self.nbv + 2 * (mt // 4) + rh + (mt % 4) * (self.d // 4)

    # ------------------------------------------------------------ host entry
    @cute.jit
    def __call__(self, q_ptr: Int64, kc_ptr: Int64, kp_ptr: Int64, vc_ptr: Int64,
                 vp_ptr: Int64, kw_ptr: Int64, vw_ptr: Int64, indptr_ptr: Int64,
                 indices_ptr: Int64, last_ptr: Int64, slots_ptr: Int64, opart_ptr: Int64,
                 lse_ptr: Int64, batch_size: Int32, num_kv_heads: Int32, group: Int32,
                 page_size: Int32, stride_page: Int32, stride_slot: Int32, stride_head: Int32,
                 sink: Int32, recent: Int32, num_splits: Int32, scale_log2: Float32,
                 stream: cuda.CUstream):
        self.kernel(q_ptr, kc_ptr, kp_ptr, vc_ptr, vp_ptr, kw_ptr, vw_ptr, indptr_ptr,
                    indices_ptr, last_ptr, slots_ptr, opart_ptr, lse_ptr, num_kv_heads, group,
                    page_size, stride_page, stride_slot, stride_head, sink, recent, num_splits,
                    scale_log2).launch(grid=(num_splits, num_kv_heads, batch_size),
                                       block=(32 * NUM_WARPS, 1, 1), stream=stream)

    # ---------------------------------------------------------- the kernel
    @cute.kernel
    def kernel(self, q_ptr: Int64, kc_ptr: Int64, kp_ptr: Int64, vc_ptr: Int64, vp_ptr: Int64,
               kw_ptr: Int64, vw_ptr: Int64, indptr_ptr: Int64, indices_ptr: Int64,
               last_ptr: Int64, slots_ptr: Int64, opart_ptr: Int64, lse_ptr: Int64,
               num_kv_heads: Int32, group: Int32, page_size: Int32, stride_page: Int32,
               stride_slot: Int32, stride_head: Int32, sink: Int32, recent: Int32,
               num_splits: Int32, scale_log2: Float32):
        d = self.d
        split, h, b = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        quad = lane % 4
        num_qo_heads = num_kv_heads * group

        # ---- sequence geometry (all on device; CUDA-graph safe)
        p_begin = _ldg_s32(indptr_ptr + Int64(b) * 4)
        p_end = _ldg_s32(indptr_ptr + Int64(b + 1) * 4)
        last = _ldg_s32(last_ptr + Int64(b) * 4)
        wslot = _ldg_s32(slots_ptr + Int64(b) * 4)
        npages = p_end - p_begin
        seq_len = Int32(0)
        if npages > 0:
            seq_len = (npages - 1) * page_size + last
        nsink = cutlass.min(sink, seq_len)
        rstart = cutlass.max(sink, seq_len - recent)
        nrec = cutlass.max(seq_len - rstart, 0)
        nwin = nsink + nrec
        int2_end = seq_len - recent               # INT2 positions: [sink, int2_end)
        ia = sink // CHUNK
        n_int2 = Int32(0)
        if int2_end > sink:
            n_int2 = (int2_end + CHUNK - 1) // CHUNK - ia
        n_win = (nwin + CHUNK - 1) // CHUNK
        total = n_win + n_int2
        per_split = (total + num_splits - 1) // num_splits
        c_begin = split * per_split
        c_end = cutlass.min(total, c_begin + per_split)
        win_rows = sink + recent

        # ---- query fragment (A operand of QK): rows g < group, permuted channels
        qrow = Int64(b) * Int64(num_qo_heads) + Int64(h * group + g)
        qa = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        qsum = Float32(0.0)
        for s in cutlass.range_constexpr(self.ksteps):
            for half in cutlass.range_constexpr(2):
                c0 = self.qk_channel(s, half, 0, quad)
                c1 = self.qk_channel(s, half, 1, quad)
                lo = Int32(0)
                hi = Int32(0)
                if g < group:
                    lo = _ldg_b16(q_ptr + (qrow * d + Int64(c0)) * 2)
                    hi = _ldg_b16(q_ptr + (qrow * d + Int64(c1)) * 2)
                word = lo | (hi << 16)
                qa[2 * s + half] = word
                f0, f1 = _bf16x2_to_f32(word)
                qsum = qsum + f0 + f1
        qsum = qsum + _shfl_bfly(qsum, 1)
        qsum = qsum + _shfl_bfly(qsum, 2)

        # ---- running state: O^T fragments, m, l, correction (per thread partials)
        acc = cute.make_rmem_tensor((4 * self.mtiles,), Float32)
        for i in cutlass.range_constexpr(4 * self.mtiles):
            acc[i] = Float32(0.0)
        st = cute.make_rmem_tensor((3,), Float32)   # m (log2 domain), l, sum p*z_v
        st[0] = Float32(NEG_INF)
        st[1] = Float32(0.0)
        st[2] = Float32(0.0)

        kbase_h = Int64(h) * Int64(stride_head)
        first = c_begin + warp

        # ---------------------------------------------- BF16 window chunks
        for c in cutlass.range(first, cutlass.min(c_end, n_win), NUM_WARPS):
            kf0 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
            kf1 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
            for n in cutlass.range_constexpr(2):
                v = c * CHUNK + g + 8 * n
                self._load_window_k(kw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent,
                                    nsink, rstart, nwin, v, quad, kf0 if n == 0 else kf1)
            va = cute.make_rmem_tensor((2 * self.mtiles * 2,), Int32)
            valid = cute.make_rmem_tensor((4,), Int32)
            self._load_window_v(vw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                                rstart, nwin, c * CHUNK, quad, g, va, valid)
            ones = cute.make_rmem_tensor((4,), Float32)
            zeros = cute.make_rmem_tensor((4,), Float32)
            for j in cutlass.range_constexpr(4):
                ones[j] = Float32(1.0)
                zeros[j] = Float32(0.0)
            self._chunk(qa, qsum, kf0, kf1, va, ones, zeros, ones, zeros, valid, acc, st,
                        scale_log2, quad)

        # ---------------------------------------------- INT2 chunks
        first_int2 = first
        if first_int2 < n_win:
            first_int2 = first_int2 + ((n_win - first_int2 + NUM_WARPS - 1) // NUM_WARPS) * NUM_WARPS
        for c in cutlass.range(first_int2, c_end, NUM_WARPS):
            pos0 = (ia + c - n_win) * CHUNK
            page = _ldg_s32(indices_ptr + Int64(p_begin + pos0 // page_size) * 4)
            slot0 = pos0 % page_size
            prow = Int64(page) * Int64(stride_page) + kbase_h
            kf0 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
            kf1 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
            for n in cutlass.range_constexpr(2):
                row = prow + Int64(slot0 + g + 8 * n) * Int64(stride_slot)
                self._unpack_k(kc_ptr + row * (d // 4) + quad * self.nbk,
                               kf0 if n == 0 else kf1)
            va = cute.make_rmem_tensor((2 * self.mtiles * 2,), Int32)
            sk = cute.make_rmem_tensor((4,), Float32)
            zk = cute.make_rmem_tensor((4,), Float32)
            sv = cute.make_rmem_tensor((4,), Float32)
            zv = cute.make_rmem_tensor((4,), Float32)
            valid = cute.make_rmem_tensor((4,), Int32)
            vw = cute.make_rmem_tensor((4,), Int32)
            for j in cutlass.range_constexpr(4):
                t = 2 * quad + (j % 2) + 8 * (j // 2)
                row = prow + Int64(slot0 + t) * Int64(stride_slot)
                pos = pos0 + t
                ok = Int32(0)
                if pos >= sink:
                    if pos < int2_end:
                        ok = Int32(1)
                valid[j] = ok
                a, zz = _f16x2_to_f32(_ldg_b32(kp_ptr + row * 4))
                sk[j] = _sel_f32(ok, a, Float32(0.0))
                zk[j] = _sel_f32(ok, zz, Float32(0.0))
                a2, z2 = _f16x2_to_f32(_ldg_b32(vp_ptr + row * 4))
                sv[j] = _sel_f32(ok, a2, Float32(0.0))
                zv[j] = _sel_f32(ok, z2, Float32(0.0))
                vaddr = vc_ptr + row * (d // 4) + g * self.nbv
                if self.nbv == 4:
                    vw[j] = _ldg_b32(vaddr)
                else:
                    vw[j] = _ldg_b16(vaddr)
            self._unpack_v(vw, va)
            self._chunk(qa, qsum, kf0, kf1, va, sk, zk, sv, zv, valid, acc, st, scale_log2,
                        quad)

        # ---- finalize this warp's split: reduce l and correction over the quad
        m_run = st[0]
        l_run = st[1] + _shfl_bfly(st[1], 1)
        l_run = l_run + _shfl_bfly(l_run, 2)
        c_run = st[2] + _shfl_bfly(st[2], 1)
        c_run = c_run + _shfl_bfly(c_run, 2)
        nsw = num_splits * NUM_WARPS
        wsplit = split * NUM_WARPS + warp
        lse2 = Float32(NEG_INF)
        inv_l = Float32(0.0)
        if l_run > Float32(0.0):
            lse2 = m_run + _lg2(l_run)
            inv_l = _rcp(l_run)
        if quad == 0:
            if g < group:
                _stg_f32(lse_ptr + ((qrow * nsw) + Int64(wsplit)) * 4, lse2)
        for j in cutlass.range_constexpr(2):
            head = 2 * quad + j
            inv_j = _shfl_idx(inv_l, head * 4)
            corr_j = _shfl_idx(c_run, head * 4)
            if head < group:
                orow = (Int64(b) * Int64(num_qo_heads) + Int64(h * group + head)) * nsw + wsplit
                for mt in cutlass.range_constexpr(self.mtiles):
                    for rh in cutlass.range_constexpr(2):
                        ch = self.pv_channel(mt, rh, g)
                        val = (acc[4 * mt + 2 * rh + j] + corr_j) * inv_j
                        _stg_f32(opart_ptr + (orow * d + Int64(ch)) * 4, val)

    # ------------------------------------------------------------- helpers
    def _unpack_k(self, addr, kf):
        """K codes of one token (this thread's D/16 bytes) -> 2*ksteps bf16x2 B fragments."""
        if self.nbk == 8:
            w0, w1 = _ldg_v2(addr)
            words = [w0, w1]
        else:
            words = [_ldg_b32(addr)]
        for wi in range(len(words)):
            for i in range(4):
                for hh in range(2):
                    kf[wi * 8 + i * 2 + hh] = _unpack2(words[wi], 2 * i + 8 * hh)

    def _unpack_v(self, vw, va):
        """V code words of tokens (2q, 2q+1, 2q+8, 2q+9) -> A fragments [pair][mt][rh]."""
        for pair in range(2):
            w_a = vw[2 * pair]
            w_b = vw[2 * pair + 1]
            for u in range(self.nbv // 2):
                x = _prmt(w_a, w_b, 0x5410 if u == 0 else 0x7632)
                for i in range(4):
                    for rh in range(2):
                        mt = 4 * u + i
                        va[(pair * self.mtiles + mt) * 2 + rh] = _unpack2(x, 2 * i + 8 * rh)

    def _win_addr(self, base, wslot, win_rows, num_kv_heads, h, wrow):
        return base + ((Int64(wslot) * Int64(win_rows) + Int64(wrow)) * Int64(num_kv_heads)
                       + Int64(h)) * (self.d * 2)

    def _load_window_k(self, kw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                       rstart, nwin, v, quad, kf):
        vv = Int32(cutlass.select_(v < nwin, v, 0))
        wrow = self._window_pos_row(vv, sink, recent, nsink, rstart)
        base = self._win_addr(kw_ptr, wslot, win_rows, num_kv_heads, h, wrow)
        d = self.d
        for i in range(4):
            ch0 = quad * self.nbk + i * (d // 4)
            addr = base + ch0 * 2
            if self.nbk == 8:
                w = list(_ldg_v4(addr))
            else:
                w = list(_ldg_v2(addr))
            for wi in range(self.nbk // 4):
                for hh in range(2):
                    kf[wi * 8 + i * 2 + hh] = _prmt(w[2 * wi], w[2 * wi + 1],
                                                    0x5410 if hh == 0 else 0x7632)

    def _window_pos_row(self, v, sink, recent, nsink, rstart):
        pos = Int32(cutlass.select_(v >= nsink, rstart + (v - nsink), v))
        ring = sink + pos % cutlass.max(recent, 1)
        return Int32(cutlass.select_(pos < sink, pos, ring))

    def _load_window_v(self, vw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                       rstart, nwin, v0, quad, g, va, valid):
        d = self.d
        words = []  # [token j][run i] -> list of b32 words (nbv/2 of them)
        for j in range(4):
            t = 2 * quad + (j % 2) + 8 * (j // 2)
            v = v0 + t
            ok = Int32(cutlass.select_(v < nwin, 1, 0))
            valid[j] = ok
            vv = Int32(cutlass.select_(v < nwin, v, 0))
            wrow = self._window_pos_row(vv, sink, recent, nsink, rstart)
            base = self._win_addr(vw_ptr, wslot, win_rows, num_kv_heads, h, wrow)
            runs = []
            for i in range(4):
                addr = base + (g * self.nbv + i * (d // 4)) * 2
                if self.nbv == 4:
                    runs.append(list(_ldg_v2(addr)))
                else:
                    runs.append([_ldg_b32(addr)])
            words.append(runs)
        for pair in range(2):
            ta, tb = words[2 * pair], words[2 * pair + 1]
            for mt in range(self.mtiles):
                u, i = mt // 4, mt % 4
                for rh in range(2):
                    va[(pair * self.mtiles + mt) * 2 + rh] = _prmt(
                        ta[i][u], tb[i][u], 0x5410 if rh == 0 else 0x7632)

    def _chunk(self, qa, qsum, kf0, kf1, va, sk, zk, sv, zv, valid, acc, st, scale_log2, quad):
        """QK (2 N tiles), online softmax, PV for one 16-token chunk of one warp."""
        zero = Int32(0)
        s0 = [Float32(0.0)] * 4
        s1 = [Float32(0.0)] * 4
        for s in range(self.ksteps):
            a0, a2 = qa[2 * s], qa[2 * s + 1]
            s0 = list(_mma(a0, zero, a2, zero, kf0[2 * s], kf0[2 * s + 1], *s0))
            s1 = list(_mma(a0, zero, a2, zero, kf1[2 * s], kf1[2 * s + 1], *s1))
        raw = [s0[0], s0[1], s1[0], s1[1]]   # tokens 2q, 2q+1, 2q+8, 2q+9 of head g
        sc = []
        for j in range(4):
            x = (sk[j] * raw[j] + zk[j] * qsum) * scale_log2
            sc.append(_sel_f32(valid[j], x, Float32(NEG_INF)))
        mx = _fmax(_fmax(sc[0], sc[1]), _fmax(sc[2], sc[3]))
        mx = _fmax(mx, _shfl_bfly(mx, 1))
        mx = _fmax(mx, _shfl_bfly(mx, 2))
        m_old = st[0]
        m_new = _fmax(m_old, mx)
        m_use = _sel_f32(Int32(cutlass.select_(m_new == Float32(NEG_INF), 0, 1)), m_new,
                         Float32(0.0))
        alpha = _ex2(m_old - m_use)
        p = [_ex2(sc[j] - m_use) for j in range(4)]
        st[0] = m_new
        st[1] = st[1] * alpha + (p[0] + p[1] + p[2] + p[3])
        st[2] = st[2] * alpha + (p[0] * zv[0] + p[1] * zv[1] + p[2] * zv[2] + p[3] * zv[3])
        b0 = _pack_bf16x2(p[0] * sv[0], p[1] * sv[1])
        b1 = _pack_bf16x2(p[2] * sv[2], p[3] * sv[3])
        al0 = _shfl_idx(alpha, (2 * quad) * 4)
        al1 = _shfl_idx(alpha, (2 * quad + 1) * 4)
        for mt in range(self.mtiles):
            c = [acc[4 * mt] * al0, acc[4 * mt + 1] * al1, acc[4 * mt + 2] * al0,
                 acc[4 * mt + 3] * al1]
            r = _mma(va[mt * 2], va[mt * 2 + 1], va[(self.mtiles + mt) * 2],
                     va[(self.mtiles + mt) * 2 + 1], b0, b1, *c)
            for i in range(4):
                acc[4 * mt + i] = r[i]


def compile_decode(config: Int2DecodeConfig):
    """``cute.compile`` the launcher for ``config`` (works without a GPU with
    ``CUTE_DSL_ARCH=sm_90a``). Returns the compiled function (exportable with
    ``export_to_c``)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cutlass.runtime import make_fake_stream

    op = Int2PagedDecodeSm90(config)
    z64, z32 = Int64(0), Int32(0)
    return cute.compile(op, *([z64] * 13), *([z32] * 10), Float32(1.0), make_fake_stream())
