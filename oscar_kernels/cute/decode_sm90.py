"""INT2 paged decode attention for Hopper (sm_90a), written in the CuTe Python DSL.

What it computes
----------------
One query per sequence over the mixed INT2/BF16 paged cache of docs/format.md, in the
rotated space, for every (sequence ``b``, KV head ``h``, query head ``g`` of its group)::

    q'      = q R_K[h]                                    (in the kernel, tensor cores)
    score_t = s_t (q'_g . c_t) + z_t sum(q'_g)          INT2 token t (scale s_t, zero z_t)
    score_t = q'_g . k'_t                                 BF16 sink/recent token
    o'_g    = sum_t p_t s^v_t c^v_t + (sum_t p_t z^v_t) 1  (+ BF16 tokens: p_t v'_t)
    o_g     = o'_g R_V[h]^T,  lse_g = ln sum_t exp(score_t * sm_scale)

Tensors (pointers and strides from :mod:`oscar_kernels.cute.launch`, argument order in
:data:`oscar_kernels.cute.config.DECODE_PTR_ARGS` / ``DECODE_INT_ARGS``):

* ``q [batch_size, num_qo_heads, head_dim]`` float32, bf16 or fp16 (``q_kind``), any
  strides of the first two dims; ``o`` the same shape in its own dtype and strides;
  ``lse [batch_size, num_qo_heads]`` float32;
* K/V codes ``[num_pages, page_size, num_kv_heads, head_dim // 4]`` uint8 (NHD, or HND
  through the row strides), scale/zero pairs ``[.., 2]`` fp16; BF16 windows
  ``[num_slots, sink + recent, num_kv_heads, head_dim]``; FlashInfer's ``kv_indptr``,
  ``kv_indices``, ``kv_last_page_len`` and one window slot per sequence (int32);
* ``R_K``, ``R_V`` as fp16 MMA operands (:func:`oscar_kernels.cute.operands.mma_operand`);
* ``o_part [batch_size, num_qo_heads, num_splits, head_dim]`` and ``lse_part`` float32
  scratch, ``tickets`` one int32 per (sequence, KV head), zero between launches.

Constraints (:func:`oscar_kernels.cute.launch.can_implement`): ``head_dim`` 64 or 128;
``group_size == head_dim``; fp16 scales; GQA ratio 1..8; NHD or HND pages of any size
(multiples of 16 run the main builds, others the ``*_anypage`` builds, up to 2^24 token
slots); ``num_pages * page_size * num_kv_heads < 2**31``; sm_90.

Kernels
-------
:class:`Int2PagedDecodeSm90` runs the whole decode in one launch, split over KV: grid
``(num_splits, num_kv_heads, batch_size)``, 4 warps per CTA (4 CTAs per SM), or in the wide
build (``warps=8``, head_dim 128) 8 warps per CTA (2 per SM) on a split-major grid
``(num_kv_heads, batch_size, num_splits)`` when ``num_splits <= RANK_MAX_SPLITS``.
``decode_pair`` (``pair=True``, GQA <= 4) runs two chunks per softmax pass, ``decode``
(GQA 5-8) one. :mod:`oscar_kernels.cute.plan` picks the build and the split count from the
shapes (never from lengths, so every launch is graph-capturable). Phases of a CTA:

1. Setup and prologue (``_setup``, ``_ring_prologue``): L2 prefetch of ``R_K[h]`` and
   ``R_V[h]`` from split 0; the loads of the query rotation and of the sequence geometry;
   the page-id block; ``q'^T = R_K^T q^T`` on the tensor cores (bf16 into shared memory);
   the first ``stages - 2`` chunks of the cp.async ring (:mod:`.decode_ring`,
   :mod:`.decode_rotation`).
2. Work split (``_warp_range``): warp ``w`` of split ``s`` owns a contiguous range of
   16-token INT2 chunks plus every ``warps * num_splits``-th BF16 window chunk, balanced by
   bytes (a window chunk counts ``WINDOW_CHUNK_COST`` INT2 chunks); in the wide build's
   single non-full wave, splits whose CTA is the first on its SM take ``RANK0_WEIGHT /
   RANK_WEIGHT`` the work.
3. INT2 loop (``_query_setup``, ``_int2_loop``, :mod:`.decode_chunk`): two chunks per
   iteration, one commit / wait / ring bookkeeping per 32 tokens; chunks entirely inside
   ``[sink, int2_end)`` take a path without position masks. The warp's first window chunk
   runs before the loop, the rest after it (:mod:`.decode_window`).
4. Combine (``_finish_warp``, ``_combine``, :mod:`.decode_tail`): the warps' partials
   through shared memory into one normalized partial and base-2 lse per (sequence, head,
   split). 4-warp builds with one split, or when the merge kernel runs next, apply
   ``R_V[h]^T`` right there (one split then stores ``o`` and lse directly).
5. Split merge (``_split_merge``, :mod:`.decode_tail`): with ``num_splits * group <=
   FUSED_TAIL_ROWS`` the last CTA of each (sequence, KV head), by atomic ticket, merges the
   partials, applies ``R_V[h]^T`` and stores ``o``; above that
   :class:`~oscar_kernels.cute.merge_sm90.Int2DecodeMergeSm90` runs as a second launch.

Why these warp roles and tiles
------------------------------
The kernel is SM-bound, not memory-bound: Nsight Compute (``perf/ncu_stalls.py``,
``decode_pair``, qwen3-8b batch 128 at 128K, HND) shows issue slots 63 % busy, the integer
ALU pipe at 61 % of peak, tensor 33 %, DRAM 77 %; so the choices below are about the
instructions one warp issues per 16-token chunk (``perf/sass_report.py``: 137 SASS per
chunk on the fast path of ``decode_pair`` at head_dim 128, 165 for ``decode``) while
enough chunks stay in flight.

* Every warp is its own producer and consumer: ``cp.async`` of whole chunks into a private
  ring (8 stages, 36 KB per CTA at head_dim 128; 4 for the builds in
  :func:`~oscar_kernels.cute.config.ring_depth`). A separate producer warp lost: 5 warps
  per CTA fit 3 CTAs per SM at 128 registers (qwen3-8b batch 128 / 128K 6.28 vs 5.01 ms),
  and 1-8 producer warps with mbarrier rings cut the math loop to 129-131.5 SASS per
  chunk but left one 12-warp CTA per SM (qwen3-8b batch 1 0.6-28 us slower).
* 4 warps per CTA, 4 CTAs per SM, 128 registers per thread (``SM_WARPS``): 3 CTAs per SM
  at 168 registers measured slower (qwen3-8b batch 128 / 128K 3.31 vs 3.21 ms). The wide
  build (8 warps, 2 CTAs per SM) halves the per-CTA work of a single wave (query
  rotation, combine, partial stores, all at the same moment on every SM): qwen3-8b batch
  2-32 2.5-9 % and llama3-70b-tp8 batch 32-256 4-18 % faster (``perf/ab.sh``).
* 16-token chunks match the MMA's M = 16 and one page row per chunk at pages of a
  multiple of 16; two chunks per iteration halve the ring bookkeeping (293 -> 211 SASS
  per chunk with the 32-chunk row blocks); no TMA: an NHD chunk is 16 scattered 32-byte
  rows, and 1D bulk copies of HND chunks need a ~25-instruction uniform-register
  waterfall each (5.11 vs 4.40 ms).
* The QK on the int8 tensor cores at head_dim 128 (one IMAD + one LOP3 per four codes,
  no shift) and the fp16 subnormal operands (one ``and`` per pair) keep the unpack, the
  integer-ALU part of the loop, small; the pair kernel's chunk pairs halve the softmax
  work per chunk with at most 4 query heads (204 -> 178 SASS per chunk).
* The query and output rotations run on the tensor cores from host-prepared fp16
  operands: 9 -> 3.6 us per CTA for the rotation, 10.5 -> 6 us for the merge tail
  (qwen3-8b batch 8 at 8K 50.5 -> 36.0 us).

Design decisions and measured alternatives
------------------------------------------
Measured on an H200 with ``perf/bench_decode.py`` / ``perf/ab.sh`` (alternating rounds)
and not kept: one S^T accumulator per chunk pair (16 more live registers, 184 instead of
173.5 SASS per chunk); the query rotation issued after the ring prologue (the main loop
scheduled 1.5-4 % longer); the merge tail and query rotation as small loops for a cold
instruction cache (batch 8 / 8K 51 -> 46 us but the main loop 2-4 % slower at 64K-128K);
a per-(sequence, KV head) queue of chunk blocks for the faster CTAs of an SM (evened the
loop times, gained nothing, ~4 % more instructions per chunk) and a chunk pool among a
sequence's splits (2-8 % slower at batch 8-128); query fragments in shared memory; four
or one QK accumulator chains; the fused split-merge tail for up to 320 rows (qwen3-8b
batch 1 / 8K 50 vs 25.5 us); 8 warps per CTA for every shape (qwen3-8b batch 1 / 8K 40 %
slower); a 16-deep ring (batch 1 10-13 % slower); 24-32 wide splits at batch 1 (15-20 %
slower); a merge CTA folding partials in as they arrive (3.4-4.2 us slower); programmatic
dependent launch of the merge kernel (~1 us saved per call in isolation, 1-2.5 us lost per
layer in the end-to-end step). Per-build variants that were measured are described where
they are chosen: :func:`~oscar_kernels.cute.config.ring_depth`,
:func:`~oscar_kernels.cute.config.k_operand_form` and the rules in :mod:`.plan`.

Debug builds: :attr:`~oscar_kernels.cute.config.Int2DecodeConfig.debug` compiles in phase
skips (timing only) or the %globaltimer trace read by ``perf/trace_decode.py``; without
flags the kernels are byte-identical to a build without the switches.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .config import (CHUNK, CTA_WARPS, DECODE_INT_ARGS, DECODE_PTR_ARGS, FUSED_TAIL_ROWS,
                     MAX_GROUP, P_TILE, PAIR_ROW, QK_S8_HEAD_DIM, RANK0_WEIGHT,
                     RANK_MAX_SPLITS, RANK_MIN_CHUNKS, RANK_WEIGHT, SM_WARPS, TAIL_ROWS,
                     TRACE_OFFSET, TRACE_WARP_OFFSET, WINDOW_CHUNK_COST, Int2DecodeConfig,
                     k_operand_form)
from .decode_chunk import DecodeChunk
from .decode_ring import DecodeRing
from .decode_rotation import DecodeRotation
from .decode_tail import DecodeTail
from .decode_window import DecodeWindow
from .ptx import (FLT_MIN, M_INIT, SUBNORMAL, _cp_commit, _cp_wait, _f32_bits, _fmax, _i2f,
                  _ldg_s32, _prefetch_l2, _ptx, _rcp, _rcp_exact, _shfl_bfly, _shfl_idx,
                  _sts_i32, _syncwarp)


class Int2PagedDecodeSm90(DecodeRing, DecodeRotation, DecodeChunk, DecodeWindow,
                          DecodeTail):
    """Split-KV INT2/BF16 paged decode attention, one specialization per ``head_dim``.

    Per thread (lane = 4 * ``g`` + ``quad``): query head ``g`` of the GQA group for QK rows,
    tokens ``g`` and ``g + 8`` of a chunk for K codes, tokens ``2 quad + {0, 1, 8, 9}`` for
    scores, V codes and all scale/zero pairs. Channel permutations:

    * fp16/bf16 QK (head_dim 64 INT2 chunks, all window chunks): K index
      ``16 s + 2 quad + j + 8 half`` is channel
      ``quad * D/16 + 4 (r // 8) + r % 2 + 2 j + ((r % 8) // 2) * D/4`` with ``r = 2 s + half``;
    * int8 QK (head_dim 128 INT2 chunks), step ``i`` (channel quarter): K index
      ``4 quad + b (+ 16)`` is channel ``8 quad + b (+ 4) + 32 i``;
    * PV M row ``16 mt + g + 8 rh`` is channel ``2 g + 16 (mt // 4) + rh + (mt % 4) * D/4``
      (V code byte pairs ``g`` and ``g + 8`` of a token, as one ``ldmatrix.trans`` hands
      them out).

    fp16 INT2 operands are subnormals ``m_i * code * 2^-24`` with ``m_i`` = 1, 4, 16, 64 for
    channel quarter ``i``: the query is pre-divided by ``m_i`` (exact, powers of two), ``2^24``
    and ``1 / m_i`` are folded into the score scale and the output normalization, and BF16
    window operands are multiplied by ``m_i`` (bf16 MMAs, probabilities times ``2^-24``) so
    that both share one accumulator. int8 INT2 operands are ``64 * code`` (u8) against the
    query's two int8 parts (see the module docstring).

    Warp roles: every warp is its own producer (``cp.async`` of whole 16-token chunks into a
    per-warp ``stages``-deep shared-memory ring) and consumer (unpack + MMA); warps of a CTA
    are independent KV splits, so no CTA barrier is needed.
    """

    def __init__(self, config: Int2DecodeConfig):
        d = config.head_dim
        if d not in (64, 128):
            raise ValueError(f"head_dim: expected 64 or 128, got {d}")
        if config.warps not in CTA_WARPS or (d // 16) % config.warps != 0:
            raise ValueError(f"warps: expected one of {CTA_WARPS} dividing head_dim / 16 = "
                             f"{d // 16}, got {config.warps}")
        if config.any_page and config.warps != 4:
            raise ValueError(f"warps: the any-page build has 4 warps per CTA, got {config.warps}")
        if config.merge_ctas and not (config.warps == 8 and config.pair):
            raise ValueError("merge_ctas: the merge-CTA build is the wide pair build (warps 8, "
                             f"pair), got warps {config.warps}, pair {config.pair}")
        self.any_page = config.any_page
        self.merge_ctas = config.merge_ctas
        self.config = config
        # debug builds only (config.debug): phase skips and the %globaltimer trace
        self.debug = config.debug
        self.trace_pro = "trace" in self.debug and "pro" in self.debug
        self.trace_ramp = ("trace" in self.debug and "ramp" in self.debug
                           and not self.trace_pro)
        self.trace_clk = "trace" in self.debug and "clk" in self.debug
        # the wide build's split shares by dispatch rank (see _warp_range)
        self.rank0_weight, self.rank_weight = config.rank_weights or (RANK0_WEIGHT,
                                                                      RANK_WEIGHT)
        self.d = d
        self.nw = config.warps         # warps per CTA
        # the wide build: split-major grid and rank-weighted split shares (see the kernel)
        self.ranked = self.nw == 8
        self.ksteps = d // 16          # QK K steps
        self.mtiles = d // 16          # PV M tiles
        self.nbk = d // 16             # K-code bytes per thread and token
        self.nbv = d // 32             # V-code bytes per thread and token
        self.s8 = d == QK_S8_HEAD_DIM  # QK on the int8 tensor cores (else fp16 subnormals)
        self.pair = config.pair        # GQA <= 4: chunk pairs share one softmax pass
        # pair kernel with the int8 QK: the query's high and low parts in adjacent MMA
        # columns (2 h, 2 h + 1 = head h), one QK chain per chunk (see _int2_pair_hl)
        self.hl = self.pair and self.s8
        # the int8 QK's K operands: masked fields, or unmasked (all quarters, or all but
        # quarter 3) with the query cancelling the other bits (see k_operand_form)
        self.k_form = k_operand_form(config)
        # the merge tail's per-split sums: unrolled by 8 in the wide pair build (batch 1
        # merges 16 splits x 4 heads there; its main loop's SASS is unchanged by it, which
        # perf/sass_report.py --dump-fast checks), left to the compiler (-1) elsewhere, where
        # an explicit unroll moved the main loops
        self.tail_unroll = 8 if self.pair and self.nw == 8 else -1
        # 4-warp builds apply R_V^T in the combine when there is one split or the merge
        # kernel runs (see the combine); the wide builds never plan the merge kernel, and
        # the same code there moved their main loops (perf/sass_report.py: 149.5 -> 151.5
        # and 176.5 -> 179 SASS per chunk), so they keep the ticket path for one split too
        self.out_rotation = self.nw == 4
        self.row_bytes = d // 4        # code bytes per token and head
        self.stage_bytes = 2 * CHUNK * self.row_bytes + 2 * CHUNK * 4
        self.stages = config.ring
        self.combine_bytes = (MAX_GROUP + MAX_GROUP * d) * 4   # per warp: lse2[8], o[8][d]
        # partial rows per merge-tail round trip: the wide pair build stages 64 (qwen3-8b
        # batch 1: 16 splits x 4 heads in one; its main loop's SASS listing unchanged;
        # batch 2-3 0.3-1 us faster with perf/ab.sh)
        self.tail_rows = 64 if self.pair and self.nw == 8 else TAIL_ROWS
        merge_bytes = (32 * self.nw + MAX_GROUP * d + self.tail_rows * d) * 4
        # the ring's shared memory, reused by the combine and the merge tail (the ring alone
        # at 8 stages; the larger of them with a 4-deep ring)
        self.ring_bytes = max(self.nw * self.stages * self.stage_bytes, merge_bytes,
                              self.nw * self.combine_bytes)
        # ring + q rows (float32) + q' (bf16)
        self.smem_bytes = self.ring_bytes + MAX_GROUP * d * (4 + 2) + self.nw * 2 * P_TILE
        assert FUSED_TAIL_ROWS <= 32 * self.nw   # one lse partial per thread in the tail

    def pv_channel(self, mt: int, rh: int, g):
        return 2 * g + 16 * (mt // 4) + rh + (mt % 4) * (self.d // 4)

    @cute.jit
    def __call__(self, q_ptr: Int64, kc_ptr: Int64, kp_ptr: Int64, vc_ptr: Int64,
                 vp_ptr: Int64, kw_ptr: Int64, vw_ptr: Int64, indptr_ptr: Int64,
                 indices_ptr: Int64, last_ptr: Int64, slots_ptr: Int64, opart_ptr: Int64,
                 lsepart_ptr: Int64, rk_ptr: Int64, rv_ptr: Int64, o_ptr: Int64, lse_ptr: Int64,
                 counter_ptr: Int64, batch_size: Int32, num_kv_heads: Int32, group: Int32,
                 page_size: Int32, stride_page: Int32, stride_slot: Int32, stride_head: Int32,
                 sink: Int32, recent: Int32, num_splits: Int32, rk_stride: Int32,
                 rv_stride: Int32, q_kind: Int32, q_stride_b: Int32, q_stride_h: Int32,
                 o_kind: Int32, o_stride_b: Int32, o_stride_h: Int32, scale_log2: Float32,
                 stream: cuda.CUstream):
        grid = [num_splits, num_kv_heads, batch_size]
        if cutlass.const_expr(self.merge_ctas):
            # split-major, and a last split slice of merge CTAs (dispatched after every split)
            grid = [num_kv_heads, batch_size, num_splits + 1]
        elif cutlass.const_expr(self.ranked):
            # split-major for few splits (see the kernel): (head, sequence, split)
            sm = num_splits <= RANK_MAX_SPLITS
            grid = [Int32(cutlass.select_(sm, num_kv_heads, num_splits)),
                    Int32(cutlass.select_(sm, batch_size, num_kv_heads)),
                    Int32(cutlass.select_(sm, num_splits, batch_size))]
        self.kernel(q_ptr, kc_ptr, kp_ptr, vc_ptr, vp_ptr, kw_ptr, vw_ptr, indptr_ptr,
                    indices_ptr, last_ptr, slots_ptr, opart_ptr, lsepart_ptr, rk_ptr, rv_ptr,
                    o_ptr, lse_ptr, counter_ptr, num_kv_heads, group, page_size, stride_page,
                    stride_slot, stride_head, sink, recent, num_splits, rk_stride, rv_stride,
                    q_kind, q_stride_b, q_stride_h, o_kind, o_stride_b, o_stride_h,
                    scale_log2).launch(grid=grid,
                                       block=(32 * self.nw, 1, 1), stream=stream,
                                       smem=self.smem_bytes,
                                       max_number_threads=[32 * self.nw, 1, 1],
                                       min_blocks_per_mp=SM_WARPS // self.nw,
                                       preferred_smem_carveout=100)

    @cute.kernel
    def kernel(self, q_ptr: Int64, kc_ptr: Int64, kp_ptr: Int64, vc_ptr: Int64, vp_ptr: Int64,
               kw_ptr: Int64, vw_ptr: Int64, indptr_ptr: Int64, indices_ptr: Int64,
               last_ptr: Int64, slots_ptr: Int64, opart_ptr: Int64, lse_ptr_part: Int64,
               rk_ptr: Int64, rv_ptr: Int64, o_ptr: Int64, lse_ptr: Int64, counter_ptr: Int64,
               num_kv_heads: Int32, group: Int32, page_size: Int32, stride_page: Int32,
               stride_slot: Int32, stride_head: Int32, sink: Int32, recent: Int32,
               num_splits: Int32, rk_stride: Int32, rv_stride: Int32, q_kind: Int32,
               q_stride_b: Int32, q_stride_h: Int32, o_kind: Int32, o_stride_b: Int32,
               o_stride_h: Int32, scale_log2: Float32):
        # the kernel's arguments by name, shared with the phases of _work
        params = dict(locals())
        del params["self"]
        if cutlass.const_expr(self.merge_ctas):
            h, b, split = cute.arch.block_idx()
            if split == num_splits:
                self._merger(h, b, opart_ptr, lse_ptr_part, rv_ptr, o_ptr, lse_ptr,
                             counter_ptr, num_kv_heads, group, num_splits, rv_stride, o_kind,
                             o_stride_b, o_stride_h)
            else:
                self._work(params, split, h, b)
        else:
            split, h, b = cute.arch.block_idx()
            if cutlass.const_expr(self.ranked):
                # the wide build with at most RANK_MAX_SPLITS splits: split-major grid (head,
                # sequence, split), so a sequence's splits span dispatch ranks (weights below)
                if num_splits <= RANK_MAX_SPLITS:
                    h, b, split = cute.arch.block_idx()
            self._work(params, split, h, b)

    @cute.jit
    def _work(self, params, split, h, b):
        """The CTA of split ``split`` of (sequence ``b``, KV head ``h``): attention over its
        share, the combine of its warps, the ticket (and the merge tail when it draws the
        last one, except in the merge-CTA build). ``params``: the kernel's arguments by name.
        The phases share their values through the namespace ``s``."""
        s = SimpleNamespace(**params, split=split, h=h, b=b)
        self._setup(s)
        self._warp_range(s)
        self._ring_prologue(s)
        self._query_setup(s)
        self._int2_loop(s)
        self._finish_warp(s)
        self._combine(s)
        self._split_merge(s)

    @cute.jit
    def _setup(self, s):
        """Thread and warp indices, shared-memory layout, the L2 prefetch of
        ``R_K[h]`` / ``R_V[h]`` (split 0), the sequence geometry loads and the query
        rotation's loads."""
        split, h, b = s.split, s.h, s.b
        (q_ptr, indptr_ptr, last_ptr, slots_ptr, rk_ptr, rv_ptr, counter_ptr, num_kv_heads,
         group, num_splits, rk_stride, rv_stride, q_kind, q_stride_b, q_stride_h) = (
            s.q_ptr, s.indptr_ptr, s.last_ptr, s.slots_ptr, s.rk_ptr, s.rv_ptr, s.counter_ptr,
            s.num_kv_heads, s.group, s.num_splits, s.rk_stride, s.rv_stride, s.q_kind,
            s.q_stride_b, s.q_stride_h)
        d = self.d
        tidx, _, _ = cute.arch.thread_idx()
        # warp-uniform: what derives from it (split ranges, ring stages, page blocks) can live
        # in uniform registers (167.5 -> 161.5 SASS per chunk, no divergence guards)
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        g = lane // 4
        quad = lane % 4
        num_qo_heads = num_kv_heads * group
        nsw = num_splits * self.nw
        wsplit = split * self.nw + warp
        cta = (b * num_kv_heads + h) * num_splits + split   # debug trace slot
        self._trace(counter_ptr, cta, 0, tidx)
        smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=16).toint()
        smem_warp = smem + warp * (self.stages * self.stage_bytes)
        s_x = smem + self.ring_bytes                 # [MAX_GROUP, d] float32: q rows
        s_q = s_x + MAX_GROUP * d * 4                # [MAX_GROUP, d] bf16: q' = q @ R_K

        # ---- L2 prefetch, from split 0 only, of R_K[h] (the later rows of the query
        # rotation) and of R_V[h] (the merge tail or the combine reads it). Every split
        # prefetching R_K cost qwen3-8b batch 1 (528 CTAs) several us of L2 requests.
        lines = d * d * 2 // 128 // (32 * self.nw)    # fp16 operands: d * d * 2 bytes
        if split == 0:
            rk_rows = rk_ptr + Int64(h) * Int64(rk_stride) * 4 + Int64(tidx) * 128
            for i in cutlass.range_constexpr(lines):
                _prefetch_l2(rk_rows + i * (32 * self.nw * 128))
            rv_rows = rv_ptr + Int64(h) * Int64(rv_stride) * 4 + Int64(tidx) * 128
            for i in cutlass.range_constexpr(lines):
                _prefetch_l2(rv_rows + i * (32 * self.nw * 128))

        # ---- sequence geometry loads (all on device; CUDA-graph safe): in flight while the
        # CTA rotates its query rows
        p_begin = _ldg_s32(indptr_ptr + Int64(b) * 4)
        p_end = _ldg_s32(indptr_ptr + Int64(b + 1) * 4)
        last = _ldg_s32(last_ptr + Int64(b) * 4)
        wslot = _ldg_s32(slots_ptr + Int64(b) * 4)
        if cutlass.const_expr(self.trace_pro):
            self._trace_dep(counter_ptr, cta, 11, tidx, p_end)

        # ---- q' = q @ R_K[h] for the group's heads (bf16, in shared memory) on the tensor
        # cores: operand and q loads first thing, the MMAs once the page ids are in flight
        # (finished after the ring prologue instead, ptxas scheduled the main loop 2-4 %
        # longer)
        rot_af = rot_qx = None
        if cutlass.const_expr("rot" not in self.debug):
            rot_af, rot_qx = self._rotation_loads(q_ptr, rk_ptr, b, h, group, rk_stride,
                                                  q_kind, q_stride_b, q_stride_h, tidx)
            if cutlass.const_expr(self.trace_pro):
                self._trace_dep(counter_ptr, cta, 13, tidx, rot_af[0][0])
                self._trace_dep(counter_ptr, cta, 14, tidx, _f32_bits(rot_qx[0]))

        (s.cta, s.d, s.g, s.lane, s.last, s.nsw, s.num_qo_heads, s.p_begin, s.p_end,
         s.quad, s.rot_af, s.rot_qx, s.s_q, s.s_x, s.smem_warp, s.tidx, s.warp, s.wslot,
         s.wsplit) = (
            cta, d, g, lane, last, nsw, num_qo_heads, p_begin, p_end, quad, rot_af, rot_qx,
            s_q, s_x, smem_warp, tidx, warp, wslot, wsplit)

    @cute.jit
    def _warp_range(self, s):
        """The sequence geometry and this warp's range of INT2 chunks ``[w_begin,
        w_end)`` (balanced by bytes with its BF16 window chunks; rank-weighted in
        the wide build's single wave)."""
        (last, nsw, num_kv_heads, num_splits, p_begin, p_end, page_size, recent, sink,
         warp, wsplit, split, h, b) = (
            s.last, s.nsw, s.num_kv_heads, s.num_splits, s.p_begin, s.p_end, s.page_size,
            s.recent, s.sink, s.warp, s.wsplit, s.split, s.h, s.b)
        # ---- sequence geometry
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
        win_rows = sink + recent
        per_warp = (n_int2 + nsw - 1) // nsw
        w_begin = cutlass.min(n_int2, wsplit * per_warp)
        w_end = cutlass.min(n_int2, w_begin + per_warp)
        # balanced by bytes: warp wsplit also runs BF16 window chunks wsplit, wsplit + nsw, ..
        # (full or full + 1 of them), each counted as WINDOW_CHUNK_COST INT2 chunks, so its
        # INT2 range is shorter by that much (when every warp's share covers its window
        # work; otherwise equal INT2 ranges as above)
        full = n_win // nsw
        rem = n_win - full * nsw
        if n_int2 >= WINDOW_CHUNK_COST * (full + 1) * nsw:
            tot = n_int2 + WINDOW_CHUNK_COST * n_win
            if cutlass.const_expr(self.ranked):
                # rank-weighted shares: in one wave CTA L = h + H (b + B s) is the L // nsm-th
                # CTA dispatched to its SM, and the first of an SM's two CTAs gets more issue
                # slots; splits of rank 0 take RANK0_WEIGHT / RANK_WEIGHT the work of the
                # others (long ranges only: at least RANK_MIN_CHUNKS per warp, where
                # the measured gains were, and every warp still covers its window work)
                # A full wave (every slot taken) is dispatched otherwise: on an H200 8 SMs
                # get two of the first #SMs CTAs and 8 others two of the rest (in the traces
                # of perf/trace_decode.py), so its splits weigh the same (equal shares were
                # 10-15 % faster there; with 258-262 CTAs the dispatch still matches
                # L // #SMs).
                npairs = num_kv_heads * cute.arch.grid_dim()[1]
                nsm = cute.arch.nsmid()          # 132 on an H100 / H200 SXM
                w0 = Int32(self.rank_weight)
                if num_splits <= RANK_MAX_SPLITS and (
                        npairs * num_splits < (SM_WARPS // self.nw) * nsm):
                    if n_int2 >= cutlass.max(RANK_MIN_CHUNKS,
                                             2 * WINDOW_CHUNK_COST * (full + 1)) * nsw:
                        w0 = Int32(self.rank0_weight)
                # splits s < c0 of this sequence and KV head have rank 0 (npairs and c0
                # assume the split-major grid; otherwise w0 == RANK_WEIGHT and every split
                # weighs the same, whatever c0 is: equal shares, still an exact partition)
                c0 = cutlass.min(num_splits, cutlass.max(
                    (nsm - h - num_kv_heads * b + npairs - 1) // npairs, 0))
                wt = w0 * c0 + self.rank_weight * (num_splits - c0)
                a0 = (tot * (w0 * cutlass.min(split, c0)
                             + self.rank_weight * cutlass.max(split - c0, 0))) // wt
                a1 = (tot * (w0 * cutlass.min(split + 1, c0)
                             + self.rank_weight * cutlass.max(split + 1 - c0, 0))) // wt
                # work units before this warp's and before the next warp's range
                w_begin = a0 + (warp * (a1 - a0)) // self.nw - WINDOW_CHUNK_COST * (
                    wsplit * full + cutlass.min(wsplit, rem))
                w_end = a0 + ((warp + 1) * (a1 - a0)) // self.nw - WINDOW_CHUNK_COST * (
                    (wsplit + 1) * full + cutlass.min(wsplit + 1, rem))
            else:
                w_begin = (wsplit * tot) // nsw - WINDOW_CHUNK_COST * (
                    wsplit * full + cutlass.min(wsplit, rem))
                w_end = ((wsplit + 1) * tot) // nsw - WINDOW_CHUNK_COST * (
                    (wsplit + 1) * full + cutlass.min(wsplit + 1, rem))
        n_mine = w_end - w_begin

        (s.ia, s.int2_end, s.n_mine, s.n_win, s.npages, s.nsink, s.nwin, s.rstart,
         s.w_begin, s.w_end, s.win_rows) = (
            ia, int2_end, n_mine, n_win, npages, nsink, nwin, rstart, w_begin, w_end, win_rows)

    @cute.jit
    def _ring_prologue(self, s):
        """The first page-id block, the query rotation on the tensor cores and the
        cp.async ring prologue (chunks ``0 .. stages - 3``)."""
        (counter_ptr, cta, d, group, ia, indices_ptr, kc_ptr, kp_ptr, lane, n_mine, npages,
         p_begin, page_size, rot_af, rot_qx, s_q, s_x, smem_warp, stride_head, stride_page,
         stride_slot, tidx, vc_ptr, vp_ptr, w_begin, warp, h) = (
            s.counter_ptr, s.cta, s.d, s.group, s.ia, s.indices_ptr, s.kc_ptr, s.kp_ptr,
            s.lane, s.n_mine, s.npages, s.p_begin, s.page_size, s.rot_af, s.rot_qx, s.s_q,
            s.s_x, s.smem_warp, s.stride_head, s.stride_page, s.stride_slot, s.tidx, s.vc_ptr,
            s.vp_ptr, s.w_begin, s.warp, s.h)
        head_row = h * stride_head
        # ---- chunk rows in blocks of 32: lane l holds the (page, slot, head) row of this
        # warp's chunk 32 k + l (pt[0]) and the page id of chunk 32 (k + 1) + l (pt[1]),
        # loaded one block ahead; an issue is then one shuffle
        tok0 = (ia + w_begin) * CHUNK
        pt = cute.make_rmem_tensor((2,), Int32)
        pt[0] = Int32(0)
        pt[1] = Int32(0)
        pg = geo = None
        if cutlass.const_expr(self.any_page):
            # any page size: per chunk, lane l finds the page of token l % 16 (its scale/zero
            # token; the code tokens' rows come by shuffle), one chunk pair ahead of its issue
            # (pg: page id and in-page row offset of the next two chunks)
            pg = cute.make_rmem_tensor((4,), Int32)
            inv_ps = _rcp_exact(_i2f(page_size))
            geo = (indices_ptr, p_begin, npages, page_size, inv_ps, stride_slot, head_row,
                   tok0, n_mine)
        elif n_mine > 0:
            pid0 = self._chunk_page_id(indices_ptr, p_begin, npages, page_size, tok0, lane)
            pt[1] = self._chunk_page_id(indices_ptr, p_begin, npages, page_size, tok0,
                                        32 + lane)
            if cutlass.const_expr(self.merge_ctas):
                # the merge-CTA build (batch 1): the page ids stay in flight during the query
                # rotation, chunk 0's row is formed after it (pt[0] holds its page id until
                # then: qwen3-8b batch 1 0.4-0.5 us faster; the other builds'
                # llama3-70b-tp8 rows were up to 0.4 % slower that way)
                pt[0] = pid0
            else:
                pt[0] = self._chunk_row(pid0, page_size, stride_page, stride_slot, head_row,
                                        tok0, lane)
                if cutlass.const_expr(self.trace_pro):
                    self._trace_dep(counter_ptr, cta, 12, tidx, pid0)

        if cutlass.const_expr("rot" not in self.debug):
            self._rotate_query(rot_af, rot_qx, s_x, s_q, group, tidx)
        if cutlass.const_expr(self.merge_ctas and not self.any_page):
            if n_mine > 0:
                if cutlass.const_expr(self.trace_pro):
                    self._trace_dep(counter_ptr, cta, 12, tidx, pt[0])
                pt[0] = self._chunk_row(pt[0], page_size, stride_page, stride_slot, head_row,
                                        tok0, lane)
        if cutlass.const_expr(self.trace_pro):
            self._trace(counter_ptr, cta, 15, tidx)
        # ---- per-lane cp.async constants (see _issue)
        rb = self.row_bytes
        if cutlass.const_expr(rb == 32):
            lc_t = lane // 2
            lc_s = lc_t * rb + (lane % 2) * 16
            lc_piece = (lane % 2) * 16
        else:
            lc_t = lane % 16
            lc_s = (lane // 16) * (CHUNK * rb) + lc_t * rb
            lc_piece = 0
        # lc: (64-bit code source base of this lane, 64-bit scale/zero source base, shared
        # offsets of its code piece and of its scale pair within a stage); a chunk's sources
        # are then base + row * bytes (one mad.wide.u32 each)
        code_base = kc_ptr if cutlass.const_expr(rb == 32) else Int64(
            cutlass.select_(lane >= 16, vc_ptr, kc_ptr))
        if cutlass.const_expr(self.any_page):
            # (the rows are per token here: no in-chunk token offset in the bases)
            lc = (code_base + lc_piece, Int64(cutlass.select_(lane >= 16, vp_ptr, kp_ptr)),
                  lc_s, 2 * CHUNK * rb + (lane // 16) * (CHUNK * 4) + (lane % 16) * 4,
                  vc_ptr - kc_ptr)
            # ---- prologue: the page rows of chunks 0 .. stages-3 (loads all in flight),
            # their issues, then the rows of the loop's first chunk pair
            rows = [self._page_row_any(k, geo, lane) for k in range(self.stages - 2)]
            for k in cutlass.range_constexpr(self.stages - 2):
                prow = rows[k][0] * stride_page + rows[k][1]
                self._issue_rows(k, n_mine, smem_warp + k * self.stage_bytes, prow, lc, lane)
                if k % 2 == 1:
                    _cp_commit()
            for u in cutlass.range_constexpr(2):
                pg[2 * u], pg[2 * u + 1] = self._page_row_any(self.stages - 2 + u, geo, lane)
        else:
            lc = (code_base + Int64(lc_t * stride_slot) * rb + lc_piece,
                  Int64(cutlass.select_(lane >= 16, vp_ptr, kp_ptr))
                  + Int64((lane % 16) * stride_slot) * 4,
                  lc_s, 2 * CHUNK * rb + (lane // 16) * (CHUNK * 4) + (lane % 16) * 4,
                  vc_ptr - kc_ptr)
            # ---- prologue of the cp.async ring: chunks 0 .. stages-3, one commit group per
            # pair
            for k in cutlass.range_constexpr(self.stages - 2):
                self._issue(k, n_mine, smem_warp + k * self.stage_bytes, pt[0], lc)
                if k % 2 == 1:
                    _cp_commit()

        if cutlass.const_expr("rot" in self.debug):   # debug: q' = 1 (no rotation)
            for e in cutlass.range(tidx, MAX_GROUP * d // 2, 32 * self.nw):
                _sts_i32(s_q + e * 4, Int32(0x3F803F80))
            cute.arch.sync_threads()
        self._trace(counter_ptr, cta, 1, tidx)
        self._trace_warp(counter_ptr, cta * self.nw + warp, 0, lane)

        (s.geo, s.head_row, s.lc, s.pg, s.pt, s.tok0) = (
            geo, head_row, lc, pg, pt, tok0)

    @cute.jit
    def _query_setup(self, s):
        """P tiles, running softmax state, the warp's first BF16 window chunk and
        the INT2 query fragments with their score constants."""
        (d, g, group, kw_ptr, lane, n_win, nsink, num_kv_heads, nwin, quad, recent, rstart,
         s_q, scale_log2, sink, vw_ptr, warp, win_rows, wslot, wsplit, h) = (
            s.d, s.g, s.group, s.kw_ptr, s.lane, s.n_win, s.nsink, s.num_kv_heads, s.nwin,
            s.quad, s.recent, s.rstart, s.s_q, s.scale_log2, s.sink, s.vw_ptr, s.warp,
            s.win_rows, s.wslot, s.wsplit, s.h)
        # this warp's two P tiles ([token][head] 16-bit, one per chunk of an iteration): this
        # lane stores its (token g + 8 n, heads 2q, 2q+1) pairs at p_st + 128 n and reads the
        # P^T fragment with ldmatrix.trans from row (lane % 16) at p_ld
        s_p = s_q + MAX_GROUP * d * 2 + warp * (2 * P_TILE)
        p_st = s_p + 4 * lane
        p_ld = s_p + (lane % 16) * (2 * MAX_GROUP)
        if cutlass.const_expr(self.pair and not self.hl):
            # pair kernel: one tile of 32-byte token rows [0 | P_B (columns 4-7) | P_A
            # (columns 0-3) | 0], so one ldmatrix.x4.trans hands out both chunks' B
            # fragments with the other chunk's columns already zero (rows at byte 16 for
            # A, at 0 for B; no masking ANDs). The zero bytes are written once here.
            _sts_i32(s_p + (lane % 16) * PAIR_ROW + 24 * (lane // 16), Int32(0))
            _sts_i32(s_p + (lane % 16) * PAIR_ROW + 24 * (lane // 16) + 4, Int32(0))
            # (BF16 window chunks use it too: their columns 0-3 at byte 16, read by lanes
            # 0-15 with ldmatrix.x2)
            p_st = s_p + g * PAIR_ROW + 4 * quad + 16 * Int32(cutlass.select_(quad < 2, 1, 0))
            p_ld = s_p + (lane % 16) * PAIR_ROW + 16 * Int32(cutlass.select_(lane < 16, 1, 0))
        if cutlass.const_expr(self.hl):
            # hl: two [head][token] tiles (A at 0, B at P_TILE; 8 rows of 16 tokens x 16 bit),
            # rows 4-7 zero (written once); lane (g, q) stores P of head q, tokens 2g, 2g+1
            # (one b32) and reads the B fragments with one ldmatrix.x4 (not transposed)
            _sts_i32(s_p + (lane // 16) * P_TILE + (4 + (lane % 16) // 4) * 32
                     + (lane % 4) * 8, Int32(0))
            _sts_i32(s_p + (lane // 16) * P_TILE + (4 + (lane % 16) // 4) * 32
                     + (lane % 4) * 8 + 4, Int32(0))
            p_st = s_p + quad * 32 + g * 4
            p_ld = s_p + (lane % 8) * 32 + ((lane // 8) % 2) * 16 + (lane // 16) * P_TILE
        # this lane's row of the V ldmatrix (see _v_frags): token (lane % 8) + 8 (tile // 2),
        # byte pairs 8 (tile % 2) .. of tile lane // 8 (head_dim 64: tiles = token halves)
        if cutlass.const_expr(self.nbv == 4):
            v_ld = ((lane % 8) + 8 * (lane // 16)) * self.row_bytes + 16 * ((lane // 8) % 2)
        else:
            v_ld = ((lane % 8) + 8 * ((lane // 8) % 2)) * self.row_bytes

        # ---- running state: O^T fragments; per head 2q+j: m, l, sum p*z_v (partials)
        acc = cute.make_rmem_tensor((4 * self.mtiles,), Float32)
        for i in cutlass.range_constexpr(4 * self.mtiles):
            acc[i] = Float32(0.0)
        st = cute.make_rmem_tensor((6,), Float32)
        for j in cutlass.range_constexpr(2):
            st[j] = Float32(M_INIT)
            st[2 + j] = Float32(0.0)
            st[4 + j] = Float32(0.0)

        # ---- query fragment (B operand of S^T): head g (rows >= group read head group-1 and
        # are zeroed), permuted channels, / m_i; fp16 for the INT2 chunks
        # pair kernel (GQA ratio <= 4): the heads in columns 0-3 and again in 4-7
        gcol = g & 3 if cutlass.const_expr(self.pair) else g
        if cutlass.const_expr(self.hl):   # columns 2 h, 2 h + 1: head h (hi / lo parts)
            gcol = g // 2
        gq = cutlass.min(gcol, group - 1)
        qkeep = Float32(cutlass.select_(gcol < group, 1.0, 0.0))
        qa = cute.make_rmem_tensor((2 * self.ksteps,), Int32)
        # per-thread constants of its two score columns, heads 2 quad + {0, 1}:
        # qh[j] = scale_log2 * sum(q'), qh[2 + j] = the INT2 score scale (scale_log2 * 2^24
        # for subnormal fp16 codes; scale_log2 * a / (64 * 256) for the int8 QK)
        qh = cute.make_rmem_tensor((4,), Float32)
        # ---- BF16 window chunk number wsplit (the first of this warp's, if any) before the
        # INT2 loop: its loads overlap the ring prologue's round trip instead of adding one
        # after the loop (bf16 query fragments; the INT2 ones are made next)
        if cutlass.const_expr("win" in self.debug):
            n_win = Int32(0)
        if wsplit < n_win:
            self._query_frags(s_q, gq, qkeep, quad, qa, False)
            self._window_chunk(wsplit, kw_ptr, vw_ptr, wslot, win_rows, num_kv_heads, h, sink,
                               recent, nsink, rstart, nwin, qa, qh, acc, st, scale_log2, quad,
                               g, p_st, p_ld)

        if cutlass.const_expr(self.s8):
            qsum, qscale = self._query_frags_s8(s_q, gq, qkeep, quad, qa,
                                                Int32(g & 1) if cutlass.const_expr(self.hl)
                                                else None)
        else:
            qsum = self._query_frags(s_q, gq, qkeep, quad, qa, True)
            qscale = Float32(1.0 / SUBNORMAL)
        qsum = qsum + _shfl_bfly(qsum, 1)
        qsum = qsum + _shfl_bfly(qsum, 2)
        if cutlass.const_expr(self.hl):
            # one head per lane, head quad (column 2 quad): the INT2 score is
            # qh[2] * (s * raw + z * qh[1]) with qh[1] = sum(q') / the int8 score scale, so
            # qh[2] multiplies once inside the exp2 (and once for the lane's max); qh[2] >=
            # FLT_MIN keeps qh[1] finite for an all-zero (or padding) head
            qh[0] = _shfl_idx(qsum, 8 * quad) * scale_log2
            qh[2] = _fmax(_shfl_idx(qscale, 8 * quad) * scale_log2, Float32(FLT_MIN))
            qh[1] = qh[0] * _rcp(qh[2])
            qh[3] = qh[2]   # unused; left unset, ptxas allocates the loop differently
        elif cutlass.const_expr(self.pair):   # head_dim-64 pair kernel
            for j in cutlass.range_constexpr(2):
                qh[j] = _shfl_idx(qsum, (2 * quad + j) * 4) * scale_log2
                qh[2 + j] = _shfl_idx(qscale, (2 * quad + j) * 4) * scale_log2
        else:
            # decode: INT2 score of head 2q + j is qh[2 + j] (s raw + z qh[j]) with qh[j] =
            # sum(q') / the score scale (qh[2 + j] >= FLT_MIN keeps it finite); qh[2 + j] is
            # applied once inside the exp2 and once for the lane max (as the hl kernel)
            for j in cutlass.range_constexpr(2):
                qh[2 + j] = _fmax(_shfl_idx(qscale, (2 * quad + j) * 4) * scale_log2,
                                  Float32(FLT_MIN))
                qh[j] = _shfl_idx(qsum, (2 * quad + j) * 4) * scale_log2 * _rcp(qh[2 + j])

        (s.acc, s.gq, s.n_win, s.p_ld, s.p_st, s.qa, s.qh, s.qkeep, s.st, s.v_ld) = (
            acc, gq, n_win, p_ld, p_st, qa, qh, qkeep, st, v_ld)

    @cute.jit
    def _int2_loop(self, s):
        """The INT2 chunks of this warp's range through the cp.async ring, two per
        iteration."""
        (acc, counter_ptr, cta, g, geo, head_row, ia, indices_ptr, int2_end, lane, lc,
         n_mine, npages, p_begin, p_ld, p_st, page_size, pg, pt, qa, qh, quad, scale_log2,
         sink, smem_warp, st, stride_page, stride_slot, tidx, tok0, v_ld, w_begin, w_end,
         warp) = (
            s.acc, s.counter_ptr, s.cta, s.g, s.geo, s.head_row, s.ia, s.indices_ptr,
            s.int2_end, s.lane, s.lc, s.n_mine, s.npages, s.p_begin, s.p_ld, s.p_st,
            s.page_size, s.pg, s.pt, s.qa, s.qh, s.quad, s.scale_log2, s.sink, s.smem_warp,
            s.st, s.stride_page, s.stride_slot, s.tidx, s.tok0, s.v_ld, s.w_begin, s.w_end,
            s.warp)
        # ---------------------------------------------- INT2 chunks (cp.async ring)
        # Two chunks per iteration (one issue/commit/wait and one set of ring bookkeeping per
        # 32 tokens). Positions at or past end_w (this warp's range end) are masked, so the
        # odd last iteration's phantom second chunk (stale stage, nothing issued) adds 0.
        end_w = cutlass.min(int2_end, (ia + w_end) * CHUNK)
        n_loop = n_mine
        if cutlass.const_expr("loop" in self.debug):
            n_loop = Int32(0)
        for i in cutlass.range(0, n_loop, 2):
            j = i + self.stages - 2
            if cutlass.const_expr(self.any_page):
                for u in cutlass.range_constexpr(2):
                    self._issue_rows(j + u, n_mine,
                                     smem_warp + ((j + u) & (self.stages - 1)) * self.stage_bytes,
                                     pg[2 * u] * stride_page + pg[2 * u + 1], lc, lane)
                _cp_commit()
                for u in cutlass.range_constexpr(2):   # the next pair's rows, a pair ahead
                    pg[2 * u], pg[2 * u + 1] = self._page_row_any(j + 2 + u, geo, lane)
            elif cutlass.const_expr("noload" in self.debug):
                _cp_commit()   # debug: no copies (the math runs on what the ring holds)
            else:
                self._issue_block_pair(j, pt, n_mine, smem_warp, lc, indices_ptr, p_begin,
                                       npages, page_size, stride_page, stride_slot, head_row,
                                       tok0, lane)
            _cp_wait(self.stages // 2 - 1)
            _syncwarp()
            if cutlass.const_expr(self.trace_ramp):
                # debug: warp 0's chunk pairs 0, 4, 8, 12 arrived (stamps 11-14)
                if warp == 0:
                    for k in cutlass.range_constexpr(4):
                        if i == 8 * k:
                            self._trace(counter_ptr, cta, 11 + k, tidx)
            sbase = smem_warp + (i & (self.stages - 1)) * self.stage_bytes
            if cutlass.const_expr("nocons" not in self.debug):   # debug: copies only
                self._consume_pair(sbase, (ia + w_begin + i) * CHUNK, sink, end_w, qa, qh,
                                   acc, st, scale_log2, quad, g, p_st, p_ld, v_ld)
            _syncwarp()
        _cp_wait(0)
        self._trace(counter_ptr, cta, 2, tidx)

    @cute.jit
    def _trace_dep(self, counter_ptr, cta, k: int, tidx, dep):
        """Debug (``trace,pro`` builds only: ``aot build --debug trace,pro``): as :func:`_trace`, slot ``k``
        (11-15: the prologue's loads), taken in a branch on ``dep`` (a value just loaded), so
        the timer is read once that load has arrived. Callers guard the call with ``self.trace_pro``
        (so ``dep`` is not even formed in other builds)."""
        if dep != Int32(0x7FC00001):
            self._trace(counter_ptr, cta, k, tidx)

    def _trace(self, counter_ptr, cta, k: int, tidx):
        """Debug (``"trace"`` builds only): thread 0 stores %globaltimer in u64 slot ``k``
        (0-6 the phases, 8-10 inside the merge tail) and %smid in slot 7 of this CTA's 16
        slots (128 B), ``TRACE_OFFSET`` bytes past the tickets."""
        if "trace" in self.debug:
            slot = counter_ptr + Int64(TRACE_OFFSET) + Int64(cta) * 128
            _ptx("{ .reg .pred p; setp.eq.s32 p, {$r2}, 0; "
                 "@p st.global.u64 [{$r0}], {$r3}; @p st.global.u32 [{$r1}], {$r4}; }", [],
                 [slot + k * 8, slot + 56, tidx, cute.arch.globaltimer(), cute.arch.smid()])
            if self.trace_clk and k in (1, 2):   # %clock64 at the INT2 loop's ends (11, 12)
                _ptx("{ .reg .pred p; setp.eq.s32 p, {$r1}, 0; @p st.global.u64 [{$r0}], "
                     "{$r2}; }", [], [slot + (10 + k) * 8, tidx, cute.arch.clock64()])

    def _trace_warp(self, counter_ptr, cw, k: int, lane):
        """Debug (``"trace"`` builds only): lane 0 of warp ``cw`` (CTA index x warps + warp)
        stores %globaltimer in u64 slot ``k`` (0: INT2 loop start, 1: its work done, before
        the CTA's combine) of its two, ``TRACE_WARP_OFFSET`` past the CTA slots."""
        if "trace" in self.debug:
            slot = counter_ptr + Int64(TRACE_OFFSET + TRACE_WARP_OFFSET) + Int64(cw) * 16
            _ptx("{ .reg .pred p; setp.eq.s32 p, {$r1}, 0; @p st.global.u64 [{$r0}], {$r2}; }",
                 [], [slot + k * 8, lane, cute.arch.globaltimer()])


def compile_decode(config: Int2DecodeConfig):
    """``cute.compile`` the launcher for ``config`` (works without a GPU with
    ``CUTE_DSL_ARCH=sm_90a``). Returns the compiled function (exportable with
    ``export_to_c``); its arguments are :data:`~oscar_kernels.cute.config.DECODE_PTR_ARGS`
    (int64), :data:`~oscar_kernels.cute.config.DECODE_INT_ARGS` (int32), ``scale_log2``
    and the stream."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cutlass.runtime import make_fake_stream

    op = Int2PagedDecodeSm90(config)
    z64, z32 = Int64(0), Int32(0)
    return cute.compile(op, *([z64] * len(DECODE_PTR_ARGS)), *([z32] * len(DECODE_INT_ARGS)),
                        Float32(1.0), make_fake_stream())
