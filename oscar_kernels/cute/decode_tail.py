"""The end of a split of :class:`~oscar_kernels.cute.decode_sm90.Int2PagedDecodeSm90`: the
warps' combine, the ticket, the merge tail and the merge CTAs.

Each warp stages its partial (lse2, normalized o') in shared memory; the CTA combines its
warps into one partial per (sequence, head, split). 4-warp builds with one split, or when
the merge kernel runs next, apply ``R_V[h]^T`` right there (one split stores ``o``
directly; the merge kernel gets partials in the model's space).

When ``num_splits * group <= FUSED_TAIL_ROWS`` every split CTA draws an atomic ticket per
(sequence, KV head) (CTA barrier, then thread 0's ``fence.acq_rel.gpu`` + ``atom.add`` +
``fence.acq_rel.gpu``, the cooperative-groups grid-barrier pattern); the CTA that draws the
last one merges the partials, applies ``R_V[h]^T`` on the tensor cores, stores ``o`` in q's
dtype through the output strides and the natural-log lse, and resets the ticket to 0 (so
CUDA-graph replays start clean). The partial rows come by ``cp.async.cg`` into the free
ring, up to 32 rows per round trip (64 in the wide pair build), with the lse partials and
``R_V``'s fragments in flight with them. In the merge-CTA build one more CTA per (sequence,
KV head) runs the tail once dry while the splits run (code into the instruction cache,
``R_V`` into L2), then polls the splits' count and merges.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .config import FUSED_TAIL_ROWS, MAX_GROUP, MERGER_SLEEP_NS
from .ptx import (NEG_INF, QUARTER_MULT, SUBNORMAL, _atom_add_s32, _counter_addr,
                  _cp_async16_if, _cp_commit, _cp_wait, _ex2, _fence_acq_rel_gpu, _fmax,
                  _ld_relaxed_s32, _ldcg_f32, _lds_b32, _lds_f32, _lg2, _nanosleep, _rcp,
                  _sel_f32, _shfl_bfly, _shfl_idx, _stg_f32, _stg_s32, _store_kind,
                  _sts_f32, _sts_i32, _syncwarp)


class DecodeTail:
    """Combine, ticket, fused merge tail and merge CTAs (a mixin of the decode kernel)."""

    @cute.jit
    def _finish_warp(self, s):
        """The rest of this warp's BF16 window chunks, then its partial (lse2,
        normalized o') staged in shared memory (the ring is free now)."""
        (acc, counter_ptr, cta, d, g, gq, kw_ptr, lane, n_win, nsink, nsw, num_kv_heads,
         nwin, p_ld, p_st, qa, qh, qkeep, quad, recent, rstart, s_q, scale_log2, sink,
         smem_warp, st, tidx, vw_ptr, warp, win_rows, wslot, wsplit, h) = (
            s.acc, s.counter_ptr, s.cta, s.d, s.g, s.gq, s.kw_ptr, s.lane, s.n_win, s.nsink,
            s.nsw, s.num_kv_heads, s.nwin, s.p_ld, s.p_st, s.qa, s.qh, s.qkeep, s.quad,
            s.recent, s.rstart, s.s_q, s.scale_log2, s.sink, s.smem_warp, s.st, s.tidx,
            s.vw_ptr, s.warp, s.win_rows, s.wslot, s.wsplit, s.h)
        # ---------------------------------------------- BF16 window chunks
        # (the rest of this warp's: every nsw-th after the one before the loop; bf16 MMAs:
        # window values times m_i may exceed the fp16 range; q fragments again, as bf16)
        if wsplit + nsw < n_win:
            self._query_frags(s_q, gq, qkeep, quad, qa, False)
        for c in cutlass.range(wsplit + nsw, n_win, nsw):
            self._window_chunk(c, kw_ptr, vw_ptr, wslot, win_rows, num_kv_heads, h, sink,
                               recent, nsink, rstart, nwin, qa, qh, acc, st, scale_log2, quad,
                               g, p_st, p_ld)

        # ---- finalize this warp's split: reduce l, correction, sum p~ over the 8 token lanes,
        # stage (lse2, normalized o) per warp in shared memory (the ring is free now)
        self._trace_warp(counter_ptr, cta * self.nw + warp, 1, lane)
        self._trace(counter_ptr, cta, 3, tidx)
        cute.arch.sync_threads()
        cbase = smem_warp - warp * (self.stages * self.stage_bytes)
        wbase = cbase + warp * self.combine_bytes
        if cutlass.const_expr(self.hl):
            # lane quad q ran head q's softmax; its O columns are heads 2q, 2q + 1
            l_hl = self._col_sum(st[2])
            c_hl = self._col_sum(st[4])
            m_hl = st[0]
        for j in cutlass.range_constexpr(2):
            head = 2 * quad + j
            if cutlass.const_expr(self.hl):
                m_run = _shfl_idx(m_hl, head & 3)
                l_run = _shfl_idx(l_hl, head & 3)
                corr_j = _shfl_idx(c_hl, head & 3)
            else:
                m_run = st[j]
                l_run = self._col_sum(st[2 + j])
                corr_j = self._col_sum(st[4 + j])
            lse2 = Float32(NEG_INF)
            inv_j = Float32(0.0)
            if l_run > Float32(0.0):
                lse2 = m_run + _lg2(l_run)
                inv_j = _rcp(l_run)
            if g == 0:
                _sts_f32(wbase + head * 4, lse2)
            for mt in cutlass.range_constexpr(self.mtiles):
                inv_m = 1.0 / (QUARTER_MULT[mt % 4] * SUBNORMAL)
                for rh in cutlass.range_constexpr(2):
                    ch = self.pv_channel(mt, rh, g)
                    val = (acc[4 * mt + 2 * rh + j] * inv_m + corr_j) * inv_j
                    _sts_f32(wbase + (MAX_GROUP + head * d + ch) * 4, val)
        cute.arch.sync_threads()

        s.cbase = cbase

    @cute.jit
    def _combine(self, s):
        """The CTA's warps combined into one partial per (sequence, head, split);
        4-warp builds with one split or before the merge kernel apply ``R_V[h]^T``
        here."""
        (cbase, d, group, lse_ptr, lse_ptr_part, num_qo_heads, num_splits, o_kind, o_ptr,
         o_stride_b, o_stride_h, opart_ptr, rv_ptr, rv_stride, s_x, tidx, split, h, b) = (
            s.cbase, s.d, s.group, s.lse_ptr, s.lse_ptr_part, s.num_qo_heads, s.num_splits,
            s.o_kind, s.o_ptr, s.o_stride_b, s.o_stride_h, s.opart_ptr, s.rv_ptr, s.rv_stride,
            s.s_x, s.tidx, s.split, s.h, s.b)
        # ---- combine the CTA's warps: one partial (lse2, o') per (sequence, head, split)
        # (pair kernel: head column h + 4 is a second partial of head h in every warp).
        # 4-warp builds (self.out_rotation) with one split, or with more partial rows than
        # the fused tail merges (the merge kernel runs next): the rows go to s_x (the q rows
        # are consumed) and o = o' R_V[h]^T is applied right here (_rotate_out), so one split
        # stores o and lse directly (no partial, ticket or reload) and the merge kernel is a
        # weighted sum. Otherwise the float32 rows o' are the partials and the merging CTA
        # applies R_V^T once, its fragments loading with the partial rows there (module
        # docstring, step 3).
        rotate = None
        if cutlass.const_expr(self.out_rotation):
            rotate = num_splits == 1 or num_splits * group > FUSED_TAIL_ROWS
        cols = 2 if cutlass.const_expr(self.pair and not self.hl) else 1
        for e in cutlass.range(tidx, group * d, 32 * self.nw):
            head = e // d
            ch = e - head * d
            mx = Float32(NEG_INF)
            for w in cutlass.range_constexpr(self.nw):
                for k in cutlass.range_constexpr(cols):
                    mx = _fmax(mx, _lds_f32(cbase + w * self.combine_bytes + (head + 4 * k) * 4))
            tot = Float32(0.0)
            val = Float32(0.0)
            if mx > Float32(NEG_INF):
                for w in cutlass.range_constexpr(self.nw):
                    for k in cutlass.range_constexpr(cols):
                        hk = head + 4 * k
                        ww = _ex2(_lds_f32(cbase + w * self.combine_bytes + hk * 4) - mx)
                        tot = tot + ww
                        val = val + ww * _lds_f32(cbase + w * self.combine_bytes
                                                  + (MAX_GROUP + hk * d + ch) * 4)
                val = val * _rcp(tot)
            hrow = (Int64(b) * Int64(num_qo_heads) + Int64(h * group + head)) * num_splits + split
            if cutlass.const_expr(self.out_rotation):
                if rotate:
                    _sts_f32(s_x + e * 4, val)
                else:
                    _stg_f32(opart_ptr + (hrow * d + Int64(ch)) * 4, val)
            else:
                _stg_f32(opart_ptr + (hrow * d + Int64(ch)) * 4, val)
            if ch == 0:
                lse2 = Float32(NEG_INF)
                if tot > Float32(0.0):
                    lse2 = mx + _lg2(tot)
                if cutlass.const_expr(self.out_rotation):
                    if num_splits == 1:   # hrow is the query row then
                        _stg_f32(lse_ptr + hrow * 4, lse2 * Float32(math.log(2.0)))
                    else:
                        _stg_f32(lse_ptr_part + hrow * 4, lse2)
                else:
                    _stg_f32(lse_ptr_part + hrow * 4, lse2)
        if cutlass.const_expr(self.out_rotation):
            if rotate:
                rv_af = self._operand_loads(rv_ptr, h, rv_stride, tidx)
                cute.arch.sync_threads()
                self._rotate_out(rv_af, s_x, opart_ptr, o_ptr, b, h, split, group,
                                 num_qo_heads, num_splits, o_kind, o_stride_b, o_stride_h,
                                 tidx)

    @cute.jit
    def _split_merge(self, s):
        """The ticket and, in the last CTA of this (sequence, KV head), the fused
        merge tail (when ``num_splits * group <= FUSED_TAIL_ROWS``)."""
        (cbase, counter_ptr, cta, group, lane, lse_ptr, lse_ptr_part, num_kv_heads,
         num_qo_heads, num_splits, o_kind, o_ptr, o_stride_b, o_stride_h, opart_ptr,
         rv_ptr, rv_stride, s_x, tidx, warp, h, b) = (
            s.cbase, s.counter_ptr, s.cta, s.group, s.lane, s.lse_ptr, s.lse_ptr_part,
            s.num_kv_heads, s.num_qo_heads, s.num_splits, s.o_kind, s.o_ptr, s.o_stride_b,
            s.o_stride_h, s.opart_ptr, s.rv_ptr, s.rv_stride, s.s_x, s.tidx, s.warp, s.h, s.b)
        # ---- the last CTA of this (sequence, KV head) to finish merges the splits (when
        # num_splits * group <= FUSED_TAIL_ROWS and, in 4-warp builds, 1 < num_splits)
        self._trace(counter_ptr, cta, 4, tidx)
        if cutlass.const_expr("tail" in self.debug):
            num_splits = Int32(FUSED_TAIL_ROWS + 1)
        fused = num_splits * group <= FUSED_TAIL_ROWS
        if cutlass.const_expr(self.out_rotation):
            fused = num_splits > 1 and fused
        if fused:
            self._ticket_and_merge(opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr,
                                   counter_ptr, s_x, cbase, b, h, cta, group, num_kv_heads,
                                   num_qo_heads, num_splits, rv_stride, o_kind, o_stride_b,
                                   o_stride_h, tidx, warp, lane)
        self._trace(counter_ptr, cta, 6, tidx)

    @cute.jit
    def _ticket_and_merge(self, opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, counter_ptr,
                          s_x, cbase, b, h, cta, group, num_kv_heads, num_qo_heads, num_splits,
                          rv_stride, o_kind, o_stride_b, o_stride_h, tidx, warp, lane):
        """Atomic ticket per (sequence, KV head); the CTA drawing the last one merges (in the
        merge-CTA build every split only counts, and the merge CTA merges: ``_merger``)."""
        if cutlass.const_expr(self.merge_ctas):
            # release: the CTA barrier orders every thread's partial stores before thread
            # 0's gpu-scope fence and count
            cute.arch.sync_threads()
            if tidx == 0:
                _fence_acq_rel_gpu()
                _atom_add_s32(_counter_addr(counter_ptr, b, h, num_kv_heads), 1)
            self._trace(counter_ptr, cta, 5, tidx)
        else:
            # the cooperative-groups grid-barrier pattern: the CTA barrier orders every
            # thread's partial stores before thread 0's gpu-scope fence + ticket (release),
            # and thread 0's fence after the ticket before the barrier that the merging
            # threads' loads follow (acquire)
            cute.arch.sync_threads()
            if tidx == 0:
                if cutlass.const_expr("fence" not in self.debug):
                    _fence_acq_rel_gpu()
                t = _atom_add_s32(_counter_addr(counter_ptr, b, h, num_kv_heads), 1)
                if cutlass.const_expr("fence" not in self.debug):
                    _fence_acq_rel_gpu()
                _sts_i32(s_x, t)
            cute.arch.sync_threads()
            self._trace(counter_ptr, cta, 5, tidx)
            if _lds_b32(s_x) == num_splits - 1:
                if cutlass.const_expr("merge" not in self.debug):
                    self._merge_tail(opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, cbase, b,
                                     h, group, num_qo_heads, num_splits, rv_stride, o_kind,
                                     o_stride_b, o_stride_h, tidx, warp, lane, counter_ptr, cta)
                if tidx == 0:   # graph-safe: the counter is zero again for the next launch
                    _stg_s32(_counter_addr(counter_ptr, b, h, num_kv_heads), 0)

    @cute.jit
    def _merger(self, h, b, opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, counter_ptr,
                num_kv_heads, group, num_splits, rv_stride, o_kind, o_stride_b, o_stride_h):
        """The merge CTA of (sequence ``b``, KV head ``h``) in the merge-CTA build (the
        grid's last split slice, dispatched after every split's CTA). It runs the merge tail
        twice, one copy of its code (a loop the compiler cannot unroll): dry at the start
        (stores off: kind 3 matches no store in ``_store_kind``), which brings the tail's
        code into this SM's instruction cache and ``R_V``'s operand into L2 while the splits
        run, then, once every split has counted its partial, for real. Off the critical path
        then: the cold code, and a merging split's ticket round trips and reload."""
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=16).toint()
        ctr = _counter_addr(counter_ptr, b, h, num_kv_heads)
        cta = (b * num_kv_heads + h) * num_splits + num_splits - 1   # debug trace slot
        runs = cutlass.min(num_splits + 1, 2)     # 2, unknown to the compiler
        for it in cutlass.range(0, runs, 1, unroll=1):
            real = it == runs - 1
            if real:
                if tidx == 0:   # acquire: the splits' fence + count, then this fence
                    while _ld_relaxed_s32(ctr) < num_splits:
                        if cutlass.const_expr(MERGER_SLEEP_NS > 0):
                            _nanosleep(MERGER_SLEEP_NS)
                    _fence_acq_rel_gpu()
                cute.arch.sync_threads()
            self._merge_tail(opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr, smem, b, h,
                             group, num_kv_heads * group, num_splits, rv_stride,
                             Int32(cutlass.select_(real, o_kind, 3)), o_stride_b, o_stride_h,
                             tidx, warp, lane, counter_ptr, cta,
                             Int32(cutlass.select_(real, 0, 3)))
            cute.arch.sync_threads()
        if tidx == 0:   # graph-safe: zero again for the next launch
            _stg_s32(ctr, 0)

    @cute.jit
    def _merge_tail(self, opart_ptr, lsepart_ptr, rv_ptr, o_ptr, lse_ptr, cbase, b, h, group,
                    num_qo_heads, num_splits, rv_stride, o_kind, o_stride_b, o_stride_h, tidx,
                    warp, lane, counter_ptr, cta, lse_kind=None):
        """Run by the last CTA of (sequence ``b``, KV head ``h``) (in the merge-CTA build by
        its merge CTA, :meth:`_merger`) when ``num_splits * group
        <= FUSED_TAIL_ROWS``: merge the partials of the group's heads
        (``w_s = 2^(lse2_s - max)``), apply ``R_V[h]^T`` on the tensor cores, store ``o`` in
        the output dtype and the natural-log lse. One memory round trip for up to
        ``self.tail_rows`` partial rows (``TAIL_ROWS``, 64 in the wide pair build; batch >= 8
        for Qwen3-8B, Llama-3-70B TP8 at batch 128):
        the o partial rows go to shared memory by ``cp.async.cg`` (no registers), the lse
        partials (``ld.global.cg``, one per thread) and ``R_V[h]``'s A fragments
        (host-prepared fp16 operand, ``oscar_kernels.cute.mma_operand``: ``o^T = R_V
        o'^T``; prefetched into L2 at the kernel's start) are in flight with them; more
        rows take one more round trip per block. Shared memory (the free ring):
        lse2 / weights ``[rows]`` (row ``e = g * num_splits + s``), the merged ``o'``
        ``[MAX_GROUP, d]``, a block of partial rows ``[self.tail_rows, d]``. ``lse_kind``
        (the merge CTA's runs): store the lse through ``_store_kind`` with this kind (3: no
        store, the dry run; its ``o_kind`` is 3 then too)."""
        d = self.d
        nrows = group * num_splits
        row0 = Int64(b) * Int64(num_qo_heads) + Int64(h * group)   # (b, first head) row
        s_w = cbase
        s_or = s_w + 32 * self.nw * 4     # one lse slot per thread
        s_op = s_or + MAX_GROUP * d * 4
        obase = opart_ptr + row0 * Int64(num_splits) * (d * 4)
        self._tail_rows(obase, 0, nrows, s_op, tidx)
        _cp_commit()
        l_t = Float32(NEG_INF)
        if tidx < nrows:
            l_t = _ldcg_f32(lsepart_ptr + (row0 * num_splits + Int64(tidx)) * 4)
        af = self._operand_loads(rv_ptr, h, rv_stride, tidx)
        _sts_f32(s_w + tidx * 4, l_t)     # threads >= FUSED_TAIL_ROWS: every row slot
        cute.arch.sync_threads()
        # weights per head (one warp per head; num_splits <= FUSED_TAIL_ROWS): w_s / sum w
        for gg in cutlass.range(warp, group, self.nw):
            lv = cute.make_rmem_tensor((FUSED_TAIL_ROWS // 32,), Float32)
            mx = Float32(NEG_INF)
            for i in cutlass.range_constexpr(FUSED_TAIL_ROWS // 32):
                sidx = lane + 32 * i
                lv[i] = Float32(NEG_INF)
                if sidx < num_splits:
                    lv[i] = _lds_f32(s_w + (gg * num_splits + sidx) * 4)
                mx = _fmax(mx, lv[i])
            for k in cutlass.range_constexpr(5):
                mx = _fmax(mx, _shfl_bfly(mx, 1 << k))
            m_use = _sel_f32(Int32(cutlass.select_(mx == Float32(NEG_INF), 0, 1)), mx,
                             Float32(0.0))
            tot = Float32(0.0)
            for i in cutlass.range_constexpr(FUSED_TAIL_ROWS // 32):
                lv[i] = _ex2(lv[i] - m_use)
                tot = tot + lv[i]
            for k in cutlass.range_constexpr(5):
                tot = tot + _shfl_bfly(tot, 1 << k)
            inv = Float32(0.0)
            lse = Float32(NEG_INF)
            if tot > Float32(0.0):
                inv = _rcp(tot)
                lse = (mx + _lg2(tot)) * Float32(math.log(2.0))
            _syncwarp()
            for i in cutlass.range_constexpr(FUSED_TAIL_ROWS // 32):
                sidx = lane + 32 * i
                if sidx < num_splits:
                    _sts_f32(s_w + (gg * num_splits + sidx) * 4, lv[i] * inv)
            if lane == 0:
                if cutlass.const_expr(lse_kind is None):
                    _stg_f32(lse_ptr + (row0 + Int64(gg)) * 4, lse)
                else:
                    _store_kind(lse_ptr, row0 + Int64(gg), lse, lse_kind)
        _cp_wait(0)
        cute.arch.sync_threads()
        self._trace(counter_ptr, cta, 8, tidx)
        # o'[g, c] = sum_s w[g, s] o_part[g, s, c]: thread t sums channel t % d of the heads
        # g = t // d (mod 128 / d), self.tail_rows rows a block
        hstep = 32 * self.nw // d
        ch = tidx % d
        ho = tidx // d
        accs = cute.make_rmem_tensor((MAX_GROUP // hstep,), Float32)
        for k in cutlass.range_constexpr(MAX_GROUP // hstep):
            accs[k] = Float32(0.0)
        if cutlass.const_expr("sums" not in self.debug):
            for e0 in cutlass.range(0, nrows, self.tail_rows):
                if e0 > 0:     # more rows than one block (batch 1-4): one round trip each
                    cute.arch.sync_threads()
                    self._tail_rows(obase, e0, nrows, s_op, tidx)
                    _cp_commit()
                    _cp_wait(0)
                    cute.arch.sync_threads()
                for k in cutlass.range_constexpr(MAX_GROUP // hstep):
                    gg = ho + hstep * k
                    if gg < group:
                        s_lo = cutlass.max(e0 - gg * num_splits, 0)
                        s_hi = cutlass.min(e0 + self.tail_rows - gg * num_splits, num_splits)
                        acc = accs[k]
                        for sidx in cutlass.range(s_lo, s_hi, 1, unroll=self.tail_unroll):
                            e = gg * num_splits + sidx
                            acc = acc + _lds_f32(s_w + e * 4) * _lds_f32(
                                s_op + ((e - e0) * d + ch) * 4)
                        accs[k] = acc
        for k in cutlass.range_constexpr(MAX_GROUP // hstep):
            gg = ho + hstep * k
            if gg < group:
                _sts_f32(s_or + (gg * d + ch) * 4, accs[k])
        self._trace(counter_ptr, cta, 9, tidx)
        cute.arch.sync_threads()
        # o[g, e] = sum_c R_V[h, e, c] o'[g, c]: warp w owns output channels of its M tiles
        g = lane // 4
        quad = lane % 4
        bf, inv_n = self._rows_b_frags(s_or, group, g, quad)
        self._trace(counter_ptr, cta, 10, tidx)
        for j in cutlass.range_constexpr(d // (16 * self.nw)):
            c = self._mma_f16_tile(af, j, bf)
            ch_o = (warp * (d // (16 * self.nw)) + j) * 16 + g
            for r in cutlass.range_constexpr(4):
                n = 2 * quad + r % 2
                if n < group:
                    oel = (Int64(b) * Int64(o_stride_b) + Int64(h * group + n)
                           * Int64(o_stride_h) + Int64(ch_o + 8 * (r // 2)))
                    _store_kind(o_ptr, oel, c[r] * inv_n[r % 2], o_kind)

    def _tail_rows(self, obase, e0, nrows, s_op, tidx):
        """``cp.async.cg`` of the o partial rows ``e0 .. e0 + self.tail_rows`` (rows past
        ``nrows`` zero-filled, nothing read) into ``s_op``; no commit."""
        d = self.d
        per_row = d // 4                       # 16-byte pieces per row of d float32
        for j in range(self.tail_rows * per_row // (32 * self.nw)):
            i = tidx + j * (32 * self.nw)
            r = i // per_row
            col = i - r * per_row
            _cp_async16_if(e0 + r, nrows, s_op + i * 16,
                           obase + (Int64(e0 + r) * d + Int64(col * 4)) * 4)
