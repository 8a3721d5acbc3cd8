"""The per-chunk math of :class:`~oscar_kernels.cute.decode_sm90.Int2PagedDecodeSm90`: unpack,
QK, online softmax, PV.

``S^T = K Q^T`` with 16 tokens as M, the (up to 8) query heads as N and the channels as K:
at head_dim 128 on the int8 tensor cores (u8 K codes times 64 against the query's high and
low int8 parts, 4 or 8 ``m16n8k32`` per chunk), at head_dim 64 on fp16 ``m16n8k16`` with
the codes as exact fp16 subnormals (one ``and`` per fp16 pair). ``O^T = V^T P^T`` on fp16
``m16n8k16`` with 16 channels as M, heads as N, the 16 tokens as K; the V operand pairs come
out of one ``ldmatrix.x4.trans`` per chunk, and S^T reaches the P^T operand through a
256-byte per-warp shared-memory tile. Online softmax per head column with a finite initial
max; the max reduction and the O / l rescale run in one warp-uniform branch only when some
lane's scores exceed the running max. The pair kernel (GQA <= 4) puts the heads twice in
the MMA columns and runs two chunks per softmax pass; at head_dim 128 ("hl") column ``2 h``
holds head h's high query part and ``2 h + 1`` its low part (one QK chain per chunk).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .config import CHUNK, MAX_GROUP, PAIR_ROW, P_TILE
from .ptx import (NEG_INF, QUARTER_MASK, SUBNORMAL, _and_mask, _ex2, _f16hi_to_f32,
                  _f16x2_to_f32, _fmax, _i2f, _lds_b32, _lds_v2, _ldsm_x2, _ldsm_x2_trans,
                  _ldsm_x4, _ldsm_x4_trans, _mad_s32, _mma, _mma_u8s8, _mul_f16x2,
                  _mul_u32, _pack_bf16x2, _pack_f16x2, _prmt, _ptx, _sel_f32, _shfl_bfly,
                  _shfl_idx, _shr, _sts_i32, _syncwarp)


class DecodeChunk:
    """Unpack, QK, online softmax and PV of INT2 chunks (a mixin of the decode kernel)."""

    @cute.jit
    def _consume_pair(self, sbase, pos0, sink, end, qa, qh, acc, st, scale_log2, quad, g,
                      p_st, p_ld, v_ld):
        """The two INT2 chunks at ring stage ``sbase`` (positions ``pos0`` ..), positions
        outside ``[sink, end)`` masked (the path without masks when there are none)."""
        sb = sbase + self.stage_bytes
        if cutlass.const_expr(self.hl):
            run = self._int2_pair_hl
            args = (sbase, sb, pos0, sink, end, qa, qh, acc, st, quad, g, p_st, p_ld, v_ld)
        elif cutlass.const_expr(self.pair):
            run = self._int2_pair
            args = (sbase, sb, pos0, sink, end, qa, qh, acc, st, scale_log2, quad, g, p_st,
                    p_ld, v_ld)
        else:
            run = self._int2_two_chunks
            args = (sbase, sb, pos0, sink, end, qa, qh, acc, st, quad, g, p_st, p_ld, v_ld)
        if pos0 >= sink and pos0 + 2 * CHUNK <= end:
            run(*args, False)
        else:
            run(*args, True)

    def _int2_two_chunks(self, sa, sb, pos0, sink, int2_end, qa, qh, acc, st, quad, g, p_st,
                         p_ld, v_ld, masked: bool):
        """``decode`` (GQA 5-8): the two INT2 chunks of an iteration (ring stages ``sa``,
        ``sb``) with one running-max update: both chunks' scores, one lane max per head
        column, vote and (rare) rescale, then each chunk's exp2 / sums / P tile / PV."""
        stages = [sa, sb]
        scs = []
        prm = []
        for u in range(2):
            kf0, kf1 = self._load_k(stages[u], quad, g)
            s_acc = self._qk(qa, kf0, kf1, True)
            sk, zk, sv, zv, valid = self._load_params(stages[u], pos0 + u * CHUNK, sink,
                                                      int2_end, g, masked)
            sc = []
            for n in range(2):
                for j in range(2):
                    x = sk[n] * s_acc[2 * n + j] + zk[n] * qh[j]
                    sc.append(x if valid is None else _sel_f32(valid[n], x, Float32(NEG_INF)))
            scs.append(sc)
            prm.append((sv, zv, valid))
        loc = [_fmax(_fmax(scs[0][j], scs[0][2 + j]), _fmax(scs[1][j], scs[1][2 + j]))
               * qh[2 + j] for j in range(2)]
        grew = (Int32(cutlass.select_(loc[0] > st[0], 1, 0))
                | Int32(cutlass.select_(loc[1] > st[1], 1, 0)))
        self._max_and_rescale(st, loc[0], loc[1], acc, cute.arch.vote_any_sync(grew != 0))
        row = 2 * MAX_GROUP
        for u in range(2):
            sc = scs[u]
            sv, zv, valid = prm[u]
            pt = []
            for j in range(2):
                p0 = _ex2(sc[j] * qh[2 + j] - st[j])
                p1 = _ex2(sc[2 + j] * qh[2 + j] - st[j])
                st[2 + j] = (st[2 + j] + p0) + p1
                st[4 + j] = (st[4 + j] + p0 * zv[0]) + p1 * zv[1]
                pt.append([p0, p1] if valid is None else [p0 * sv[0], p1 * sv[1]])
            packed = []
            for n in range(2):
                if valid is None:   # full chunk: fp16 P pair x (s_v, s_v) pair
                    packed.append(_mul_f16x2(_pack_f16x2(pt[0][n], pt[1][n]), sv[n]))
                else:
                    packed.append(_pack_f16x2(pt[0][n], pt[1][n]))
            _sts_i32(p_st + u * P_TILE, packed[0])
            _sts_i32(p_st + u * P_TILE + 8 * row, packed[1])
            _syncwarp()
            b0, b1 = _ldsm_x2_trans(p_ld + u * P_TILE)
            va = self._v_frags(stages[u], v_ld)
            for mt in range(self.mtiles):
                c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                r = _mma(*va(mt), b0, b1, *c, f16=True)
                for i in range(4):
                    acc[4 * mt + i] = r[i]

    def _int2_pair(self, sa, sb, pos0, sink, int2_end, qa, qh, acc, st, scale_log2, quad, g,
                   p_st, p_ld, v_ld, masked: bool):
        """Two INT2 chunks (ring stages ``sa``, ``sb``; positions pos0.., pos0 + 16..) with
        one softmax pass, for GQA ratios <= 4: the query fragment holds the group's heads
        in columns 0-3 and again in 4-7, so chunk A's scores are live in lanes of columns
        0-3 (quad < 2) and chunk B's in lanes of columns 4-7 (quad >= 2): one select per
        score merges them, and the scale/exp/sum/pack work per 16 tokens and warp halves
        (columns 4-7 carry a second running state per head, merged in the combine). The
        P tile then holds [P_A | P_B]; each PV MMA takes its chunk's columns (the other
        half of the B fragment zeroed). Head_dim 64 (fp16 QK); head_dim 128 runs
        :meth:`_int2_pair_hl`."""
        hi = Int32(cutlass.select_(quad >= 2, 1, 0))
        kf0, kf1 = self._load_k(sa, quad, g)
        s_a = self._qk(qa, kf0, kf1, True)
        kf0, kf1 = self._load_k(sb, quad, g)
        s_b = self._qk(qa, kf0, kf1, True)
        s_acc = [_sel_f32(hi, s_b[k], s_a[k]) for k in range(4)]
        sown = sa + hi * (sb - sa)
        sk, zk, sv, zv, valid = self._load_params(sown, pos0 + hi * CHUNK, sink, int2_end, g,
                                                  masked)
        v_frags = (self._v_frags(sa, v_ld), self._v_frags(sb, v_ld))
        self._softmax_pv(s_acc, qh, v_frags, sk, zk, sv, zv, valid, acc, st, scale_log2,
                         p_st, p_ld, True, g)

    def _int2_pair_hl(self, sa, sb, pos0, sink, int2_end, qa, qh, acc, st, quad, g, p_st,
                      p_ld, v_ld, masked: bool):
        """Two INT2 chunks, one softmax pass, head_dim 128 with GQA <= 4 ("hl"): the query
        fragment holds head h's high int8 part in column 2 h and its low part in column
        2 h + 1, so one IMMA chain per chunk (4 instead of 8) yields in lane (g, q) the
        high and low s32 sums of head q for tokens 2g, 2g+1 (MMA rows g, g + 8): ``256 hi +
        lo`` in-lane. Each lane runs head q's online softmax over its 4 scores (both
        chunks, one running state); P goes through two [head][token] tiles (rows 4-7 zero)
        and one ldmatrix.x4, and both chunks' PV accumulate into columns 0-3."""
        kf0, kf1 = self._load_k(sa, quad, g)
        s_a = self._qk_hl(qa, kf0, kf1)
        kf0, kf1 = self._load_k(sb, quad, g)
        s_b = self._qk_hl(qa, kf0, kf1)
        ska, zka, sva, zva, vla = self._params_hl(sa, pos0, sink, int2_end, g, masked)
        skb, zkb, svb, zvb, vlb = self._params_hl(sb, pos0 + CHUNK, sink, int2_end, g, masked)
        raw = [_i2f(s_a[0]), _i2f(s_a[1]), _i2f(s_b[0]), _i2f(s_b[1])]
        sk = ska + skb
        zk = zka + zkb
        ys = []   # scores / qh[2]
        for k in range(4):
            y = sk[k] * raw[k] + zk[k] * qh[1]
            if masked:
                y = _sel_f32((vla + vlb)[k], y, Float32(NEG_INF))
            ys.append(y)
        self._softmax_pv_hl(ys, None, sva + svb, zva + zvb,
                            (self._v_frags(sa, v_ld), self._v_frags(sb, v_ld)), acc, st, p_st,
                            p_ld, quad, qh[2])

    def _tok(self, g, n: int):
        """Token (within a chunk) of MMA row ``g + 8 n``: ``g + 8 n``, or ``2 g + n`` in the hl
        kernel (so lane (g, q)'s two scores are adjacent tokens: one b32 P store, one
        64-bit load of their scale/zero pairs)."""
        return 2 * g + n if self.hl else g + 8 * n

    def _load_k(self, sbase, quad, g):
        """A fragments of the chunk's K codes at ring stage ``sbase`` (tokens g, g + 8)."""
        rb = self.row_bytes
        kf0 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        kf1 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        for n in range(2):
            t = self._tok(g, n)
            addr = sbase + t * rb + quad * self.nbk
            if self.nbk == 8:
                w0, w1 = _lds_v2(addr)
                words = [w0, w1]
            else:
                words = [_lds_b32(addr)]
            if cutlass.const_expr(self.s8):
                # kf[2 i + wi]: word wi times 4^(3 - i) (u8 A operand: quarter i's codes at
                # bits 6-7 of every byte), masked to 64 x the fields, or unmasked (the other
                # bits are the lower quarters and the next-lower byte's upper ones, which
                # the query fragments cancel: unmasked_k_query), per k_operand_form
                kf = kf0 if n == 0 else kf1
                for wi in range(2):
                    for i in range(4):
                        x = words[wi] if i == 3 else _mul_u32(words[wi], 4 ** (3 - i))
                        if cutlass.const_expr(self.k_form == "masked"
                                              or (self.k_form == "top" and i == 3)):
                            x = _ptx("and.b32 {$w0}, {$r0}, 0xC0C0C0C0;", [Int32], [x])
                        kf[2 * i + wi] = x
            else:
                self._unpack_k(words, kf0 if n == 0 else kf1)
        return kf0, kf1

    def _unpack_k(self, words, kf):
        """K code words of one token -> 2*ksteps A fragments of fp16 ``m_i * code * 2^-24``."""
        for wi in range(len(words)):
            x = words[wi]
            src = [x, _shr(x, 8)]        # [hh]: bytes 0, 2 / bytes 1, 3 at bits 0-7, 16-23
            for i in range(4):
                for hh in range(2):
                    kf[wi * 8 + i * 2 + hh] = _and_mask(src[hh], QUARTER_MASK[i])

    def _load_params(self, sbase, pos0, sink, int2_end, g, masked: bool):
        """Scale/zero of K and V of this lane's tokens g, g + 8 (V's zeroed, and a 0/1
        validity per token returned, when ``masked``). ``decode``'s full chunks: ``sv[n]``
        is the V scale as a broadcast fp16 pair (for the P pair's ``mul.f16x2``)."""
        rb = self.row_bytes
        f16_sv = not masked and not self.pair
        sk = cute.make_rmem_tensor((2,), Float32)
        zk = cute.make_rmem_tensor((2,), Float32)
        sv = cute.make_rmem_tensor((2,), Int32 if f16_sv else Float32)
        zv = cute.make_rmem_tensor((2,), Float32)
        valid = cute.make_rmem_tensor((2,), Int32) if masked else None
        for n in range(2):
            t = g + 8 * n
            a, zz = _f16x2_to_f32(_lds_b32(sbase + 2 * CHUNK * rb + t * 4))
            sk[n] = a
            zk[n] = zz
            vw = _lds_b32(sbase + 2 * CHUNK * rb + CHUNK * 4 + t * 4)
            if f16_sv:
                sv[n] = Int32(_prmt(vw, vw, 0x1010))
                zv[n] = _f16hi_to_f32(vw)
                continue
            a2, z2 = _f16x2_to_f32(vw)
            if masked:
                pos = pos0 + t
                ok = (Int32(cutlass.select_(pos >= sink, 1, 0))
                      & Int32(cutlass.select_(pos < int2_end, 1, 0)))
                valid[n] = ok
                sv[n] = _sel_f32(ok, a2, Float32(0.0))
                zv[n] = _sel_f32(ok, z2, Float32(0.0))
            else:
                sv[n] = a2
                zv[n] = z2
        return sk, zk, sv, zv, valid

    def _params_hl(self, sbase, pos0, sink, int2_end, g, masked: bool):
        """Scale/zero of K and V of tokens 2g, 2g+1 (one 64-bit load each). Full chunks:
        ``sv`` is one fp16 pair ``(s_v(2g), s_v(2g+1))`` for ``mul.f16x2``; masked chunks:
        two float32 scales zeroed outside ``[sink, int2_end)`` and the 0/1 validities."""
        rb = self.row_bytes
        kw = _lds_v2(sbase + 2 * CHUNK * rb + 2 * g * 4)
        vw = _lds_v2(sbase + 2 * CHUNK * rb + CHUNK * 4 + 2 * g * 4)
        sk, zk, sv, zv, valid = [], [], [], [], []
        for n in range(2):
            a, zz = _f16x2_to_f32(kw[n])
            sk.append(a)
            zk.append(zz)
            if not masked:
                # V scales stay fp16: (s_2g, s_2g+1) for one mul.f16x2 with the P pair
                zv.append(_f16hi_to_f32(vw[n]))
                continue
            a2, z2 = _f16x2_to_f32(vw[n])
            pos = pos0 + 2 * g + n
            ok = (Int32(cutlass.select_(pos >= sink, 1, 0))
                  & Int32(cutlass.select_(pos < int2_end, 1, 0)))
            valid.append(ok)
            sv.append(_sel_f32(ok, a2, Float32(0.0)))
            zv.append(_sel_f32(ok, z2, Float32(0.0)))
        if not masked:
            sv = [_prmt(vw[0], vw[1], 0x5410)]
        return sk, zk, sv, zv, (valid if masked else None)

    def _v_frags(self, sbase, v_ld):
        """V codes of the chunk at ``sbase`` -> ``f(mt)``: the A fragment of M tile ``mt``,
        unpacked lazily right before its MMA (fewer live registers). One ``ldmatrix.trans``
        (rows = tokens, 16-bit columns = code byte pairs; ``v_ld``: this lane's row address
        offset) hands lane (g, q) the byte pairs ``g`` (and ``g + 8`` at head_dim 128) of
        tokens ``2q, 2q + 1`` (and ``+ 8``) packed as (token 2q | token 2q + 1): the
        (token, token + 1) operand pairs without loads per token or byte permutes."""
        vaddr = sbase + CHUNK * self.row_bytes + v_ld
        if cutlass.const_expr(self.nbv == 4):
            r = _ldsm_x4_trans(vaddr)
            xs = [[r[0], r[1]], [r[2], r[3]]]
        else:
            r = _ldsm_x2_trans(vaddr)
            xs = [[r[0]], [r[1]]]
        shifted = [[_shr(x, 8) for x in row] for row in xs]

        def v_frag(mt):
            u, i = mt // 4, mt % 4
            frag = []
            for pair in range(2):
                for rh in range(2):
                    x = xs[pair][u] if rh == 0 else shifted[pair][u]
                    # m * code * 2^-24 exactly (fp16 subnormal): no offset in the O
                    # accumulators, which sum over thousands of tokens
                    frag.append(_and_mask(x, QUARTER_MASK[i]))
            return frag
        return v_frag

    def _qk(self, qa, kf0, kf1, is_int2: bool):
        """S^T of one chunk: s_acc[2 n + j] = score of token g + 8 n, head column 2 quad + j
        (raw: INT2 chunks before the per-token scale/zero)."""
        if is_int2 and self.s8:
            # two s32 chains (high / low query parts) over the four quarters, hi * 256 + lo
            z = Int32(0)
            ch = [[z] * 4, [z] * 4]
            for i in range(4):
                for part in range(2):
                    ch[part] = list(_mma_u8s8(kf0[2 * i], kf1[2 * i], kf0[2 * i + 1],
                                              kf1[2 * i + 1], qa[8 * part + 2 * i],
                                              qa[8 * part + 2 * i + 1], *ch[part]))
            s_acc = [_i2f(_mad_s32(ch[0][k], 256, ch[1][k])) for k in range(4)]
        else:
            chains = [[Float32(0.0)] * 4, [Float32(0.0)] * 4]   # two independent MMA chains
            for s in range(self.ksteps):
                chains[s % 2] = list(_mma(kf0[2 * s], kf1[2 * s], kf0[2 * s + 1],
                                          kf1[2 * s + 1], qa[2 * s], qa[2 * s + 1],
                                          *chains[s % 2], f16=is_int2))
            s_acc = [chains[0][i] + chains[1][i] for i in range(4)]
        return s_acc

    def _qk_hl(self, qa, kf0, kf1):
        """hl kernel: S^T of one chunk on one int8 chain, columns (2 h, 2 h + 1) = head h's
        (high, low) parts: the exact s32 scores of head ``quad``, tokens 2g, 2g+1."""
        z = Int32(0)
        c = [z] * 4
        for i in range(4):
            c = list(_mma_u8s8(kf0[2 * i], kf1[2 * i], kf0[2 * i + 1], kf1[2 * i + 1],
                               qa[2 * i], qa[2 * i + 1], *c))
        return [_mad_s32(c[0], 256, c[1]), _mad_s32(c[2], 256, c[3])]

    def _chunk(self, qa, qh, kf0, kf1, va, sk, zk, sv, zv, valid, acc, st, scale_log2, quad,
               p_st, p_ld, is_int2: bool):
        """One 16-token chunk of one warp: S^T = K Q^T (tokens x heads), online softmax per
        head column, warp transpose of P to the B operand, O^T += V^T P^T."""
        s_acc = self._qk(qa, kf0, kf1, is_int2)
        self._softmax_pv(s_acc, qh, va, sk, zk, sv, zv, valid, acc, st, scale_log2, p_st,
                         p_ld, is_int2, None)

    def _softmax_pv(self, s_acc, qh, va, sk, zk, sv, zv, valid, acc, st, scale_log2, p_st,
                    p_ld, is_int2: bool, g_pair):
        """Online softmax of the scores ``s_acc`` and O^T += V^T P^T. ``g_pair`` (this lane's
        head column g) set: a chunk pair (``va`` = (V of A, V of B)), see _int2_pair."""
        sc = []
        sk2 = [[sk[n] * qh[2 + j] for j in range(2)] for n in range(2)] if is_int2 else None
        for n in range(2):
            for j in range(2):
                raw = s_acc[2 * n + j]
                if is_int2:
                    x = sk2[n][j] * raw + zk[n] * qh[j]
                else:
                    x = raw * scale_log2
                sc.append(x if valid is None else _sel_f32(valid[n], x, Float32(NEG_INF)))
        pt = []      # p~ (fp32) per (j, n)
        packed = []  # per n: bf16x2 (head 2q, head 2q+1)
        loc = [_fmax(sc[0], sc[2]), _fmax(sc[1], sc[3])]     # this lane's max per head
        grew = (Int32(cutlass.select_(loc[0] > st[0], 1, 0))
                | Int32(cutlass.select_(loc[1] > st[1], 1, 0)))
        self._max_and_rescale(st, loc[0], loc[1], acc, cute.arch.vote_any_sync(grew != 0))
        for j in range(2):
            p0 = _ex2(sc[j] - st[j])
            p1 = _ex2(sc[2 + j] - st[j])
            # the same sum in two float orders: each kernel keeps the one it was GPU-tested
            # and timed with (pair: the head_dim-64 kernel; decode: its window chunks)
            if self.pair:
                st[2 + j] = st[2 + j] + (p0 + p1)
            else:
                st[2 + j] = (st[2 + j] + p0) + p1
            if is_int2:
                st[4 + j] = st[4 + j] + (p0 * zv[0] + p1 * zv[1])
                pt.append([p0 * sv[0], p1 * sv[1]])
            else:
                # window P on the INT2 operands' 2^-24 scale (bf16 has the exponent range)
                pt.append([p0 * Float32(SUBNORMAL), p1 * Float32(SUBNORMAL)])
        for n in range(2):
            packed.append((_pack_f16x2 if is_int2 else _pack_bf16x2)(pt[0][n], pt[1][n]))
        # P^T B fragment of lane (g, q): tokens 2q, 2q+1 (+8) of head g
        # through this warp's P tile: [token][head] stores, ldmatrix.trans -> (tokens 2q,
        # 2q + 1 (+ 8), head g); the tile of a chunk is rewritten two chunks later (window
        # chunks: one tile, ordered by the sync before the next store)
        if not is_int2 or g_pair is not None:
            _syncwarp()
        row = PAIR_ROW if self.pair else 2 * MAX_GROUP
        _sts_i32(p_st, packed[0])
        _sts_i32(p_st + 8 * row, packed[1])
        _syncwarp()
        if g_pair is not None:
            # pair tile (see kernel): chunk A's B fragment = (tokens 2q.. of head g < 4, 0
            # for g >= 4), chunk B's = (0, head g >= 4), in one ldmatrix.x4.trans
            r = _ldsm_x4_trans(p_ld)
            bs = [(r[0], r[1]), (r[2], r[3])]
            for mt in range(self.mtiles):
                for c_i in range(2):
                    c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                    r = _mma(*va[c_i](mt), bs[c_i][0], bs[c_i][1], *c, f16=True)
                    for i in range(4):
                        acc[4 * mt + i] = r[i]
            return
        b0, b1 = _ldsm_x2_trans(p_ld)
        for mt in range(self.mtiles):
            c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
            if callable(va):
                a = va(mt)
            else:
                a = [va[mt * 2], va[mt * 2 + 1], va[(self.mtiles + mt) * 2],
                     va[(self.mtiles + mt) * 2 + 1]]
            r = _mma(*a, b0, b1, *c, f16=is_int2)
            for i in range(4):
                acc[4 * mt + i] = r[i]

    def _softmax_pv_hl(self, xs, valid, sv, zv, va, acc, st, p_st, p_ld, quad, scale=None):
        """hl online softmax of head ``quad`` over the scores ``scale * xs`` (4: an INT2
        chunk pair, tokens 2g, 2g+1 of A then B, with ``sv``/``zv``; 2: a BF16 window chunk
        (``scale`` None), ``va`` its operands and ``valid`` its token mask), then O^T +=
        V^T P^T. ``scale`` > 0 multiplies inside the exp2 and once for the lane's max."""
        if valid is not None:
            xs = [_sel_f32(valid[k], xs[k], Float32(NEG_INF)) for k in range(len(xs))]
        loc = xs[0]
        for x in xs[1:]:
            loc = _fmax(loc, x)
        if scale is not None:
            loc = loc * scale
        grew = Int32(cutlass.select_(loc > st[0], 1, 0))
        self._rescale_hl(st, loc, acc, quad, cute.arch.vote_any_sync(grew != 0))
        if scale is not None:
            ps = [_ex2(x * scale - st[0]) for x in xs]
        else:
            ps = [_ex2(x - st[0]) for x in xs]
        tot = st[2]
        for pk in ps:
            tot = tot + pk
        st[2] = tot
        _syncwarp()
        if sv is not None:
            corr = st[4]
            for k in range(4):
                corr = corr + ps[k] * zv[k]
            st[4] = corr
            if len(sv) == 2:   # full chunks: fp16 (s_v, s_v') pairs, one f16x2 multiply
                _sts_i32(p_st, _mul_f16x2(_pack_f16x2(ps[0], ps[1]), sv[0]))
                _sts_i32(p_st + P_TILE, _mul_f16x2(_pack_f16x2(ps[2], ps[3]), sv[1]))
            else:
                _sts_i32(p_st, _pack_f16x2(ps[0] * sv[0], ps[1] * sv[1]))
                _sts_i32(p_st + P_TILE, _pack_f16x2(ps[2] * sv[2], ps[3] * sv[3]))
            _syncwarp()
            r = _ldsm_x4(p_ld)
            for mt in range(self.mtiles):
                for c_i in range(2):
                    c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                    out = _mma(*va[c_i](mt), r[2 * c_i], r[2 * c_i + 1], *c, f16=True)
                    for i in range(4):
                        acc[4 * mt + i] = out[i]
        else:
            # window P on the INT2 operands' 2^-24 scale (bf16 has the exponent range)
            _sts_i32(p_st, _pack_bf16x2(ps[0] * Float32(SUBNORMAL), ps[1] * Float32(SUBNORMAL)))
            _syncwarp()
            b0, b1 = _ldsm_x2(p_ld)
            for mt in range(self.mtiles):
                c = [acc[4 * mt], acc[4 * mt + 1], acc[4 * mt + 2], acc[4 * mt + 3]]
                a = [va[mt * 2], va[mt * 2 + 1], va[(self.mtiles + mt) * 2],
                     va[(self.mtiles + mt) * 2 + 1]]
                out = _mma(*a, b0, b1, *c)
                for i in range(4):
                    acc[4 * mt + i] = out[i]

    @cute.jit
    def _max_and_rescale(self, st, loc0, loc1, acc, moved):
        """Running max per head column, updated only when some lane's scores exceed it
        (warp-uniform ``moved``); then l, the corrections and O^T are rescaled (lazy)."""
        if moved:
            al = cute.make_rmem_tensor((2,), Float32)
            for j in cutlass.range_constexpr(2):
                m_old = st[j]
                m_new = _fmax(m_old, self._col_max(loc0 if j == 0 else loc1))
                a = _ex2(m_old - m_new)
                al[j] = a
                st[j] = m_new
                st[2 + j] = st[2 + j] * a
                st[4 + j] = st[4 + j] * a
            for i in cutlass.range_constexpr(2 * self.mtiles):
                acc[2 * i] = acc[2 * i] * al[0]
                acc[2 * i + 1] = acc[2 * i + 1] * al[1]

    @cute.jit
    def _rescale_hl(self, st, loc, acc, quad, moved):
        """hl: head quad's running max (lanes of one quad share it), updated only when some
        lane's scores exceed it; l, the correction and the O^T columns 2 quad, 2 quad + 1
        (heads whose softmax ran in quads 2 quad, 2 quad + 1) rescaled."""
        if moved:
            m_old = st[0]
            m_new = _fmax(m_old, self._col_max(loc))
            a = _ex2(m_old - m_new)
            st[0] = m_new
            st[2] = st[2] * a
            st[4] = st[4] * a
            a0 = _shfl_idx(a, (2 * quad) & 3)
            a1 = _shfl_idx(a, (2 * quad + 1) & 3)
            for i in cutlass.range_constexpr(2 * self.mtiles):
                acc[2 * i] = acc[2 * i] * a0
                acc[2 * i + 1] = acc[2 * i + 1] * a1

    def _col_sum(self, x):
        """Sum over the 8 lanes of one quad position (lanes q, q+4, ..., q+28)."""
        x = x + _shfl_bfly(x, 4)
        x = x + _shfl_bfly(x, 8)
        return x + _shfl_bfly(x, 16)

    def _col_max(self, x):
        x = _fmax(x, _shfl_bfly(x, 4))
        x = _fmax(x, _shfl_bfly(x, 8))
        return _fmax(x, _shfl_bfly(x, 16))
