"""Query and output rotations of :class:`~oscar_kernels.cute.decode_sm90.Int2PagedDecodeSm90`
on the tensor cores, and the query fragments of the QK.

``q'^T = R_K^T q^T`` at the CTA's start and ``o^T = R_V o'^T`` at its end are fp16
``m16n8k16`` MMAs with the query heads as N, on operands the host converts once per
rotation tensor into A-fragment order (:func:`oscar_kernels.cute.operands.mma_operand`:
32 KB per head at head_dim 128, one 16-byte load per fragment, all in flight at once).
Rows get a per-head power-of-two scale so any finite value fits fp16. Warp ``w`` owns the
M tiles ``w * d / (16 warps) ..`` (which is why head_dim 64, 4 M tiles, has no 8-warp
build).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .config import MAX_GROUP
from .operands import unmasked_k_query
from .ptx import (QUARTER_MULT, _bf16x2_to_f32, _bits_f32, _f2i_rn, _f32_bits, _fabs,
                  _fmax, _i2f, _ldg_kind, _ldg_v4, _lds_v2, _lds_v2f, _mma, _pack_bf16x2,
                  _pack_f16x2, _pack_s8x4, _rcp_exact, _sel_f32, _shfl_bfly, _shfl_idx,
                  _store_kind, _sts_b16_of_f32, _sts_f32)


class DecodeRotation:
    """Query / output rotations and query fragments (a mixin of the decode kernel)."""

    def _mma_lane(self, tidx):
        """``(warp, g, quad, M tiles per warp)`` of thread ``tidx`` for the rotations' MMAs
        (lane = 4 g + quad; warp ``w`` owns M tiles ``w * d/(16 nw) ..``)."""
        lane = tidx % 32
        return tidx // 32, lane // 4, lane % 4, self.d // (16 * self.nw)

    def _operand_loads(self, ptr, h, stride, tidx):
        """This warp's A fragments of a host-prepared ``d x d`` fp16 operand
        (``oscar_kernels.cute.mma_operand``, ``[mt][ks][lane][4 x b32]``, head stride
        ``stride`` words): M tiles ``warp * d/(16 nw) + j``, all ``d/16`` K steps, one 16-byte
        load each, all in flight at once."""
        d = self.d
        warp = tidx // 32
        lane = tidx % 32
        mt_w = d // (16 * self.nw)
        ks_n = d // 16
        abase = ptr + (Int64(h) * Int64(stride) + Int64(lane * 4)) * 4
        af = []
        for j in range(mt_w):
            for ks in range(ks_n):
                af.append(_ldg_v4(abase + Int64(((warp * mt_w + j) * ks_n + ks) * 512)))
        return af

    @cute.jit
    def _rotation_loads(self, q_ptr, rk_ptr, b, h, group, rk_stride, q_kind, q_stride_b,
                        q_stride_h, tidx):
        """Issue the loads of the query rotation (at the kernel's start, so that their
        round trip overlaps the sequence geometry and page-id loads): this warp's A fragments
        of ``R_K^T`` and this thread's q elements. ``rk_ptr`` is the host-prepared operand
        (:func:`oscar_kernels.cute.rk_operand`): ``R_K^T`` in fp16, already in A-fragment
        order ``[mt][ks][lane][4 x b32]``, so warp ``w`` loads its ``d / (16 nw)`` M tiles x
        ``d / 16`` K steps as 16-byte loads, all in flight at once (32 KB per head at
        ``d = 128``, half the bytes of float32)."""
        d = self.d
        af = self._operand_loads(rk_ptr, h, rk_stride, tidx)
        qx = []
        for i in cutlass.range_constexpr(MAX_GROUP * d // (32 * self.nw)):
            e = tidx + i * (32 * self.nw)
            gg = cutlass.min(e // d, group - 1)
            qel = (Int64(b) * Int64(q_stride_b) + Int64(h * group + gg) * Int64(q_stride_h)
                   + Int64(e - (e // d) * d))
            qx.append(_ldg_kind(q_ptr + qel * 4, q_ptr + qel * 2, q_kind))
        return af, qx

    def _rows_b_frags(self, s_rows, group, g, quad):
        """B fragments (``m16n8k16``, K = the d channels, N = 8 heads) of the float32 rows
        ``s_rows[head, d]`` in shared memory: lane (g, quad) holds head ``g`` (columns past
        the group are zero) at channels ``16 ks + 2 quad (+ 8)``, as fp16 pairs after a
        per-head power-of-two scale that puts the row's largest magnitude in ``[2^13, 2^14)``
        (no overflow for any finite row; exact for bf16 values in fp16's normal range).
        Returns the fragments and the unscale factors of this lane's output columns
        ``2 quad`` and ``2 quad + 1``."""
        d = self.d
        gq = cutlass.min(g, group - 1)
        keep = Float32(cutlass.select_(g < group, 1.0, 0.0))
        xv = []
        mx = Float32(0.0)
        for ks in range(d // 16):
            for half in range(2):
                x0, x1 = _lds_v2f(s_rows + (gq * d + 16 * ks + 8 * half + 2 * quad) * 4)
                xv.append((x0 * keep, x1 * keep))
                mx = _fmax(mx, _fmax(_fabs(x0), _fabs(x1)))
        mx = _fmax(mx, _shfl_bfly(mx, 1))
        mx = _fmax(mx, _shfl_bfly(mx, 2))
        # scale 2^(13 - floor(log2 max)) from the exponent field, clamped to normal floats
        ebits = (_f32_bits(mx) >> 23) & 0xFF
        sexp = cutlass.max(1, cutlass.min(253, 267 - ebits))
        scale = _bits_f32(sexp << 23)
        inv = _bits_f32((254 - sexp) << 23)
        bf = [_pack_f16x2(x0 * scale, x1 * scale) for x0, x1 in xv]
        return bf, [_shfl_idx(inv, 8 * quad), _shfl_idx(inv, 8 * quad + 4)]

    def _mma_f16_tile(self, af, j, bf):
        """D (16 x 8, float32) of M tile ``j`` of this warp: the A fragments ``af[j * d/16 +
        ks]`` (host-prepared, see ``oscar_kernels.cute.mma_operand``) times ``bf``."""
        ks_n = self.d // 16
        c = [Float32(0.0)] * 4
        for ks in range(ks_n):
            a = af[j * ks_n + ks]
            c = list(_mma(a[0], a[1], a[2], a[3], bf[2 * ks], bf[2 * ks + 1], *c, f16=True))
        return c

    @cute.jit
    def _rotate_query(self, af, qx, s_x, s_q, group, tidx):
        """``s_q[g, c] = bf16(sum_k q[b, h * group + g, k] R_K[h, k, c])`` for ``g < group``,
        on the tensor cores from the loads of :meth:`_rotation_loads`: ``q'^T = R_K^T q^T``
        as fp16 ``m16n8k16`` MMAs with the heads as N. q rows are staged as float32 in
        ``s_x``; each head is scaled by a power of two so that its largest ``|q|`` lies in
        ``[2^13, 2^14)`` before the fp16 conversion (exact for bf16 q in fp16's normal range;
        no overflow for any finite q) and unscaled after the MMA."""
        d = self.d
        warp, g, quad, mt_w = self._mma_lane(tidx)
        for i in cutlass.range_constexpr(MAX_GROUP * d // (32 * self.nw)):
            e = tidx + i * (32 * self.nw)
            if e < group * d:
                _sts_f32(s_x + e * 4, qx[i])
        cute.arch.sync_threads()
        bf, inv_n = self._rows_b_frags(s_x, group, g, quad)
        for j in cutlass.range_constexpr(mt_w):
            c = self._mma_f16_tile(af, j, bf)
            ch = (warp * mt_w + j) * 16 + g
            for r in cutlass.range_constexpr(4):
                n = 2 * quad + r % 2
                if n < group:
                    _sts_b16_of_f32(s_q + (n * d + ch + 8 * (r // 2)) * 2, c[r] * inv_n[r % 2])
        cute.arch.sync_threads()

    def _query_frags(self, s_q, gq, qkeep, quad, qa, f16: bool):
        """B fragments of head ``gq``'s q' (from shared memory) divided by ``m_i``, as fp16
        (``f16``: INT2 chunks) or bf16 (window chunks); returns this lane's partial sum of
        q' (exact in float32 from the bf16 q')."""
        d = self.d
        qsum = Float32(0.0)
        runs = []
        for wi in range(self.nbk // 4):
            for i in range(4):
                ch = quad * self.nbk + 4 * wi + i * (d // 4)   # channels ch .. ch + 3
                runs.append(list(_lds_v2(s_q + (gq * d + ch) * 2)))
        pack = _pack_f16x2 if f16 else _pack_bf16x2
        for wi in range(self.nbk // 4):
            for i in range(4):
                w01, w23 = runs[wi * 4 + i]
                q0, q1 = _bf16x2_to_f32(w01)
                q2, q3 = _bf16x2_to_f32(w23)
                qe = [q0 * qkeep, q1 * qkeep, q2 * qkeep, q3 * qkeep]
                inv_m = 1.0 / QUARTER_MULT[i]
                for hh in range(2):
                    # r = 8 wi + 2 i + hh holds channels (ch + hh, ch + hh + 2)
                    qa[wi * 8 + i * 2 + hh] = pack(qe[hh] * inv_m, qe[hh + 2] * inv_m)
                qsum = qsum + ((qe[0] + qe[1]) + (qe[2] + qe[3]))
        return qsum

    def _query_frags_s8(self, s_q, gq, qkeep, quad, qa, lane_odd=None):
        """B fragments of head ``gq``'s q' for the int8 QK (``m16n8k32``): lane quad ``q``
        holds channels ``8 q + 32 i + (0..7)`` of quarter ``i`` (QK step ``i``), as
        ``qa[2 i + {0, 1}]`` (high parts) and ``qa[8 + 2 i + {0, 1}]`` (low parts) of
        ``q' = a (hi + lo / 256)``, ``a = max|q'| / 127`` over the head; ``lane_odd`` given
        (hl kernel, column g = head g // 2): only ``qa[2 i + {0, 1}]``, the low part when it
        is nonzero, else the high part. Returns this lane's partial sum of q' and ``a / (64
        * 256)`` (the score scale of the combined s32)."""
        d = self.d
        qv = []
        for i in range(4):
            for half in range(2):
                w = _lds_v2(s_q + (gq * d + 8 * quad + 32 * i + 4 * half) * 2)
                q0, q1 = _bf16x2_to_f32(w[0])
                q2, q3 = _bf16x2_to_f32(w[1])
                qv.append([q0 * qkeep, q1 * qkeep, q2 * qkeep, q3 * qkeep])
        qsum = Float32(0.0)
        for v in qv:
            qsum = qsum + ((v[0] + v[1]) + (v[2] + v[3]))
        if cutlass.const_expr(self.k_form in ("unmasked", "top")):
            # qv[2 i + half][j]: quarter i, byte j of this lane's code word ``half``; the
            # unmasked K operands (_load_k) need the triangular transform of each word's 16
            for half in range(2):
                qt = unmasked_k_query([qv[2 * i + half] for i in range(4)],
                                      self.k_form == "top")
                for i in range(4):
                    qv[2 * i + half] = qt[i]
        mx = Float32(0.0)
        for v in qv:
            for x in v:
                mx = _fmax(mx, _fabs(x))
        mx = _fmax(mx, _shfl_bfly(mx, 1))
        mx = _fmax(mx, _shfl_bfly(mx, 2))
        pos = Int32(cutlass.select_(mx > Float32(0.0), 1, 0))
        inv = _sel_f32(pos, Float32(127.0) * _rcp_exact(mx), Float32(0.0))
        for r in range(8):
            hi = [_f2i_rn(x * inv) for x in qv[r]]
            lo = [cutlass.max(-127, cutlass.min(127, _f2i_rn((qv[r][k] * inv - _i2f(hi[k]))
                                                             * Float32(256.0))))
                  for k in range(4)]
            if self.hl:    # column g: head g // 2, high part (g even) or low part (g odd)
                qa[r] = Int32(cutlass.select_(lane_odd != 0, _pack_s8x4(*lo),
                                              _pack_s8x4(*hi)))
            else:
                qa[r] = _pack_s8x4(*hi)
                qa[8 + r] = _pack_s8x4(*lo)
        return qsum, mx * Float32(1.0 / (127.0 * 64.0 * 256.0))

    @cute.jit
    def _rotate_out(self, af, s_rows, opart_ptr, o_ptr, b, h, split, group, num_qo_heads,
                    num_splits, o_kind, o_stride_b, o_stride_h, tidx):
        """This split's ``o = o' R_V[h]^T`` (``o^T = R_V o'^T``: fp16 ``m16n8k16`` MMAs, the
        heads as N, ``af`` from :meth:`_operand_loads`) from the float32 rows ``s_rows[g, d]``
        in shared memory: stored as the float32 partial of split ``split``, or with one
        split as ``o`` in the output dtype. Warp ``w`` owns the output channels of its
        ``d / (16 nw)`` M tiles."""
        d = self.d
        warp, g, quad, mt_w = self._mma_lane(tidx)
        bf, inv_n = self._rows_b_frags(s_rows, group, g, quad)
        # element (head n, channel e) at base + (n * n_stride + e) * size: the partial
        # [b, h * group + n, split, e] (float32), or with one split o[b, h * group + n, e]
        row0 = Int64(b) * Int64(num_qo_heads) + Int64(h * group)
        base = o_ptr
        kind = o_kind
        el0 = Int64(b) * Int64(o_stride_b) + Int64(h * group) * Int64(o_stride_h)
        n_stride = Int64(o_stride_h)
        if num_splits > 1:
            base = opart_ptr
            kind = Int32(0)
            el0 = (row0 * num_splits + split) * d
            n_stride = Int64(num_splits * d)
        for j in cutlass.range_constexpr(mt_w):
            c = self._mma_f16_tile(af, j, bf)
            ch_o = (warp * mt_w + j) * 16 + g
            for r in cutlass.range_constexpr(4):
                n = 2 * quad + r % 2
                if n < group:
                    _store_kind(base, el0 + Int64(n) * n_stride + Int64(ch_o + 8 * (r // 2)),
                                c[r] * inv_n[r % 2], kind)
