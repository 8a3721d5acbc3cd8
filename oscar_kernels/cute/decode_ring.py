"""The cp.async ring of :class:`~oscar_kernels.cute.decode_sm90.Int2PagedDecodeSm90`: page
walk and chunk copies.

Each warp is its own producer: it copies whole 16-token chunks (K and V codes, 2 x 16 x
D/4 bytes, and 2 x 16 scale/zero pairs) with ``cp.async`` into a private ``stages``-deep
ring in shared memory. With pages of a multiple of 16 tokens a chunk is one page row: lane
``l`` holds the (page, slot, head) row of the warp's chunk ``32 k + l`` and the page id of
chunk ``32 (k + 1) + l`` (loaded one block ahead), so an issue is one shuffle, one
``mad.wide.u32`` per source and the copies. With any other page size a chunk's tokens may
lie in several pages: lane ``l`` finds the page of token ``l % 16`` one chunk pair ahead
(a float reciprocal, exact below 2^24 positions) and the code pieces' rows come by
shuffle. Copies past the warp's range read nothing (``cp.async`` src-size 0).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .config import CHUNK
from .ptx import (_cp_async16_if, _cp_async4_if, _cp_commit, _ldg_s32, _ldg_s32_if,
                  _mad_wide_u32, _shfl_idx, _udiv_rcp)


class DecodeRing:
    """Page walk and chunk copies into each warp's cp.async ring (a mixin of the decode kernel)."""

    @cute.jit
    def _issue_block_pair(self, j, pt, n_mine, smem_warp, lc, indices_ptr, p_begin, npages,
                          page_size, stride_page, stride_slot, head_row, tok0, lane):
        """Issue this warp's chunks ``j``, ``j + 1`` (``j`` even) from its 32-chunk row block
        ``pt`` (refreshed, and the next block's page ids loaded, at a block start) and
        commit them as one group."""
        if (j & 31) == 0:     # j is even: chunks j and j + 1 share a block
            pt[0] = self._chunk_row(pt[1], page_size, stride_page, stride_slot,
                                    head_row, tok0, j + lane)
            pt[1] = self._chunk_page_id(indices_ptr, p_begin, npages, page_size, tok0,
                                        j + 32 + lane)
        for u in cutlass.range_constexpr(2):
            self._issue(j + u, n_mine,
                        smem_warp + ((j + u) & (self.stages - 1)) * self.stage_bytes,
                        pt[0], lc)
        _cp_commit()

    @cute.jit
    def _chunk_page_id(self, indices_ptr, p_begin, npages, page_size, tok0, c):
        """Page id of this warp's chunk ``c`` (0 past the sequence's last page)."""
        pn = (tok0 + c * CHUNK) // page_size
        pid = Int32(0)
        if pn < npages:
            pid = _ldg_s32(indices_ptr + Int64(p_begin + pn) * 4)
        return pid

    def _chunk_row(self, pid, page_size, stride_page, stride_slot, head_row, tok0, c):
        """(page, slot, head) row of this warp's chunk ``c`` in page ``pid``."""
        t = tok0 + c * CHUNK
        return pid * stride_page + (t - (t // page_size) * page_size) * stride_slot + head_row

    def _page_row_any(self, c, geo, lane):
        """Any page size: ``(page id, in-page row offset + head row)`` of token ``l % 16`` of
        this warp's chunk ``c`` for lane ``l`` (page id 0 past the sequence's pages or the
        warp's range: nothing is read there). The page number comes from a float reciprocal
        and one correction each way (exact for positions below 2^24)."""
        indices_ptr, p_begin, npages, page_size, inv_ps, stride_slot, head_row, tok0, n = geo
        x = tok0 + c * CHUNK + lane % 16
        pn = _udiv_rcp(x, page_size, inv_ps)
        pid = _ldg_s32_if(indices_ptr + Int64(p_begin + pn) * 4,
                          Int32(cutlass.select_(pn < npages, 1, 0))
                          & Int32(cutlass.select_(c < n, 1, 0)))
        return pid, (x - pn * page_size) * stride_slot + head_row

    def _issue_rows(self, c, n_mine, sdst, prow, lc, lane):
        """Any page size: cp.async this warp's chunk ``c`` into ring stage ``sdst``; ``prow``
        is the (page, slot, head) row of token ``lane % 16`` (this lane's scale/zero pair),
        the code pieces' token rows come by shuffle (head_dim 128: token ``lane // 2``)."""
        crow = prow
        if cutlass.const_expr(self.row_bytes == 32):
            crow = _shfl_idx(prow, lane // 2)
        self._copy_chunk(c, n_mine, sdst, crow, prow, lc)

    def _issue(self, c, n_mine, sdst, blk, lc):
        """cp.async this warp's chunk ``c`` (K/V codes + scale/zero pairs) into ring stage
        ``sdst`` (predicated off past ``n_mine``); its row comes from the block ``blk``."""
        prow = _shfl_idx(blk, c & 31)
        self._copy_chunk(c, n_mine, sdst, prow, prow, lc)

    def _copy_chunk(self, c, n_mine, sdst, crow, prow, lc):
        """The copies of chunk ``c`` (nothing read past ``n_mine``): this lane's code pieces
        from row ``crow``, its scale/zero pair from row ``prow``."""
        # the rows fit int32 (checked on the host): one wide multiply per source address
        code_src, par_src, s_c, s4, dv = lc
        ka = _mad_wide_u32(crow, self.row_bytes, code_src)
        pa = _mad_wide_u32(prow, 4, par_src)
        if cutlass.const_expr(self.row_bytes == 32):
            _cp_async16_if(c, n_mine, sdst + s_c, ka)
            _cp_async16_if(c, n_mine, sdst + s_c + CHUNK * 32, ka + dv)
        else:
            _cp_async16_if(c, n_mine, sdst + s_c, ka)
        _cp_async4_if(c, n_mine, sdst + s4, pa)
