"""BF16 window chunks of :class:`~oscar_kernels.cute.decode_sm90.Int2PagedDecodeSm90`.

The sink and recent tokens of a sequence live in BF16 window slots; a window chunk is 16 of
them, read with plain vector loads (few per sequence) and run through bf16 ``m16n8k16``
MMAs with their own bf16 query fragments (window values times the quarter multipliers may
exceed the fp16 range), into the same accumulators as the INT2 chunks.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .config import CHUNK
from .ptx import QUARTER_MULT, _ldg_b32, _ldg_v2, _ldg_v4, _mul_bf16x2, _prmt


class DecodeWindow:
    """BF16 window chunks (a mixin of the decode kernel)."""

    def _window_chunk(self, c, kw_ptr, vw_ptr, wslot, win_rows, num_kv_heads, h, sink,
                      recent, nsink, rstart, nwin, qa, qh, acc, st, scale_log2, quad, g, p_st,
                      p_ld):
        """BF16 window chunk ``c`` (positions ``16 c ..`` of the sink + recent window, plain
        loads) with the bf16 query fragments ``qa``."""
        kf0 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        kf1 = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        for n in range(2):
            v = c * CHUNK + self._tok(g, n)
            self._load_window_k(kw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent,
                                nsink, rstart, nwin, v, quad, kf0 if n == 0 else kf1)
        va = cute.make_rmem_tensor((2 * self.mtiles * 2,), Int32)
        self._load_window_v(vw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                            rstart, nwin, c * CHUNK, quad, g, va)
        valid = cute.make_rmem_tensor((2,), Int32)
        for n in range(2):
            valid[n] = Int32(cutlass.select_(c * CHUNK + self._tok(g, n) < nwin, 1, 0))
            if self.pair and not self.hl:
                # columns 4-7 repeat the heads: use 0-3
                valid[n] = valid[n] & Int32(cutlass.select_(quad < 2, 1, 0))
        if self.hl:
            s_w = self._qk(qa, kf0, kf1, False)
            xs = [s_w[0] * scale_log2, s_w[2] * scale_log2]   # tokens 2g, 2g+1, head q
            self._softmax_pv_hl(xs, valid, None, None, va, acc, st, p_st, p_ld, quad)
        else:
            self._chunk(qa, qh, kf0, kf1, va, None, None, None, None, valid, acc, st,
                        scale_log2, quad, p_st, p_ld, False)

    def _win_addr(self, base, wslot, win_rows, num_kv_heads, h, wrow):
        return base + ((Int64(wslot) * Int64(win_rows) + Int64(wrow)) * Int64(num_kv_heads)
                       + Int64(h)) * (self.d * 2)

    def _window_pos_row(self, v, sink, recent, nsink, rstart):
        pos = Int32(cutlass.select_(v >= nsink, rstart + (v - nsink), v))
        ring = sink + pos % cutlass.max(recent, 1)
        return Int32(cutlass.select_(pos < sink, pos, ring))

    def _load_window_k(self, kw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                       rstart, nwin, v, quad, kf):
        vv = Int32(cutlass.select_(v < nwin, v, 0))
        wrow = self._window_pos_row(vv, sink, recent, nsink, rstart)
        base = self._win_addr(kw_ptr, wslot, win_rows, num_kv_heads, h, wrow)
        d = self.d
        for i in range(4):
            addr = base + (quad * self.nbk + i * (d // 4)) * 2
            w = list(_ldg_v4(addr)) if self.nbk == 8 else list(_ldg_v2(addr))
            for wi in range(self.nbk // 4):
                for hh in range(2):
                    kf[wi * 8 + i * 2 + hh] = _mul_bf16x2(
                        _prmt(w[2 * wi], w[2 * wi + 1], 0x5410 if hh == 0 else 0x7632),
                        QUARTER_MULT[i])

    def _load_window_v(self, vw_ptr, wslot, win_rows, num_kv_heads, h, sink, recent, nsink,
                       rstart, nwin, v0, quad, g, va):
        d = self.d
        words = []  # [token j][run i] -> b32 words (nbv/2 of them)
        for j in range(4):
            t = 2 * quad + (j % 2) + 8 * (j // 2)
            v = v0 + t
            vv = Int32(cutlass.select_(v < nwin, v, 0))
            wrow = self._window_pos_row(vv, sink, recent, nsink, rstart)
            base = self._win_addr(vw_ptr, wslot, win_rows, num_kv_heads, h, wrow)
            runs = []
            for i in range(4):      # channels 2g + 16u, + 1 of quarter i (see pv_channel)
                runs.append([_ldg_b32(base + (2 * g + 16 * u + i * (d // 4)) * 2)
                             for u in range(self.nbv // 2)])
            words.append(runs)
        for pair in range(2):
            ta, tb = words[2 * pair], words[2 * pair + 1]
            for mt in range(self.mtiles):
                u, i = mt // 4, mt % 4
                for rh in range(2):
                    va[(pair * self.mtiles + mt) * 2 + rh] = _mul_bf16x2(
                        _prmt(ta[i][u], tb[i][u], 0x5410 if rh == 0 else 0x7632),
                        QUARTER_MULT[i])
