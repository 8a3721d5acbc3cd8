"""Split merge of the CuTe decode for many partials (sm_90a), written in the CuTe Python DSL.

What it computes: for every (sequence ``b``, query head ``g``) the weighted sum of the
``num_splits`` partials of :class:`~oscar_kernels.cute.decode_sm90.Int2PagedDecodeSm90`
(already in the model's space: every split applied ``R_V^T``)::

    w_s = 2^(lse2_s - max lse2)
    o   = sum_s w_s o_part[b, g, s] / sum_s w_s,   lse = ln 2 * (max lse2 + log2 sum_s w_s)

(``-inf`` and ``o = 0`` for a sequence without tokens).

Tensors: ``o_part [batch_size, num_qo_heads, num_splits, head_dim]`` and ``lse_part
[batch_size, num_qo_heads, num_splits]`` float32 (base-2 lse); ``o`` written at
``o_ptr + (b * o_stride_b + g * o_stride_h + e) * elem`` as float32 (``o_kind`` 0), bf16
(1) or fp16 (2), straight into the caller's ``out``; ``lse [batch_size, num_qo_heads]``
float32. Arguments in the order of :data:`~oscar_kernels.cute.config.MERGE_PTR_ARGS` /
``MERGE_INT_ARGS``. Constraints: ``num_splits <= MAX_SPLITS``; head_dim 64 or 128.

Why this shape: it runs only when ``num_splits * group > FUSED_TAIL_ROWS`` (batch 1-16
with few KV heads), where one CTA cannot pull the partials fast enough (Llama-3-70B TP8
batch 1 at 8K: 47 us in the decode's fused tail against 37 us with this kernel, measured
with ``perf/bench_decode.py``). One CTA per (sequence, query head), ``MERGE_PARTS *
head_dim`` threads: part ``p`` sums every ``MERGE_PARTS``-th split for channel ``e``, and
the partial rows are loaded before the split weights are known (one round trip fewer).
"""

from __future__ import annotations

import math
import os

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .config import (Int2DecodeConfig, MAX_SPLITS, MERGE_INT_ARGS, MERGE_PARTS,
                     MERGE_PTR_ARGS)
from .ptx import (NEG_INF, _ex2, _fmax, _ldg_f32, _lds_f32, _lg2, _rcp, _sel_f32,
                  _shfl_bfly, _stg_f32, _store_kind, _sts_f32)


class Int2DecodeMergeSm90:
    """Merge the splits of :class:`Int2PagedDecodeSm90` and store in the output dtype: one
    CTA per (sequence, query head), ``MERGE_PARTS * head_dim`` threads (part ``p``, channel
    ``e``). The partials are in the model's space already (each split applied ``R_V^T``).

    ``o[b, g, e] = sum_s w_s o_part[b, g, s, e] / sum_s w_s`` with
    ``w_s = 2^(lse2_s - max lse2)``; ``lse = ln 2 * (max lse2 + log2 sum_s w_s)``
    (``-inf`` and ``o = 0`` for a sequence without tokens). ``o`` is written at
    ``o_ptr + (b * o_stride_b + qh * o_stride_h + e) * elem`` as float32 (``out_kind`` 0),
    bf16 (1) or fp16 (2), so it lands directly in the caller's ``out``. Requires
    ``num_splits <= MAX_SPLITS``.
    """

    def __init__(self, config: Int2DecodeConfig):
        self.d = config.head_dim
        self.threads = MERGE_PARTS * self.d

    @cute.jit
    def __call__(self, opart_ptr: Int64, lse_part_ptr: Int64, o_ptr: Int64, lse_ptr: Int64,
                 batch_size: Int32, num_kv_heads: Int32, group: Int32, num_splits: Int32,
                 out_kind: Int32, o_stride_b: Int32, o_stride_h: Int32,
                 stream: cuda.CUstream):
        self.kernel(opart_ptr, lse_part_ptr, o_ptr, lse_ptr, num_splits, out_kind, o_stride_b,
                    o_stride_h).launch(grid=(num_kv_heads * group, batch_size, 1),
                                       block=(self.threads, 1, 1), stream=stream,
                                       smem=(2 * self.threads + 64) * 4)

    @cute.kernel
    def kernel(self, opart_ptr: Int64, lse_part_ptr: Int64, o_ptr: Int64, lse_ptr: Int64,
               num_splits: Int32, out_kind: Int32, o_stride_b: Int32, o_stride_h: Int32):
        d = self.d
        nthreads = self.threads
        nwarps = nthreads // 32
        qh, b, _ = cute.arch.block_idx()
        num_qo_heads = cute.arch.grid_dim()[0]
        t, _, _ = cute.arch.thread_idx()
        lane = t % 32
        warp = t // 32
        part = t // d
        ch = t - part * d
        sm = cute.arch.get_dyn_smem(cutlass.Int8, alignment=16).toint()
        s_w = sm                          # [nthreads] split weights
        s_red = sm + nthreads * 4         # [nthreads] partial sums
        s_warp = sm + 2 * nthreads * 4    # [nwarps] warp maxima, then sums
        row = Int64(b) * Int64(num_qo_heads) + Int64(qh)
        # this thread's partials o_part[s][ch] of the splits s = part (mod MERGE_PARTS),
        # issued before the split weights are known (one memory round trip fewer)
        obase = opart_ptr + (row * num_splits * d + Int64(ch)) * 4
        vals = []
        for k in cutlass.range_constexpr(MAX_SPLITS // MERGE_PARTS):
            sidx = cutlass.min(part + k * MERGE_PARTS, num_splits - 1)   # w = 0 past the end
            vals.append(_ldg_f32(obase + Int64(sidx) * (d * 4)))
        # lse2 of split t, block max
        l_t = Float32(NEG_INF)
        if t < num_splits:
            l_t = _ldg_f32(lse_part_ptr + (row * num_splits + Int64(t)) * 4)
        mx = l_t
        for k in cutlass.range_constexpr(5):
            mx = _fmax(mx, _shfl_bfly(mx, 1 << k))
        if lane == 0:
            _sts_f32(s_warp + warp * 4, mx)
        cute.arch.sync_threads()
        mx = Float32(NEG_INF)
        for w in cutlass.range_constexpr(nwarps):
            mx = _fmax(mx, _lds_f32(s_warp + w * 4))
        m_use = _sel_f32(Int32(cutlass.select_(mx == Float32(NEG_INF), 0, 1)), mx, Float32(0.0))
        w_t = _ex2(l_t - m_use)
        _sts_f32(s_w + t * 4, w_t)
        tot = w_t
        for k in cutlass.range_constexpr(5):
            tot = tot + _shfl_bfly(tot, 1 << k)
        cute.arch.sync_threads()
        if lane == 0:
            _sts_f32(s_warp + warp * 4, tot)
        # sum_s w_s o_part[s][ch] over the splits s = part (mod MERGE_PARTS)
        acc = Float32(0.0)
        for k in cutlass.range_constexpr(MAX_SPLITS // MERGE_PARTS):
            acc = acc + _lds_f32(s_w + (part + k * MERGE_PARTS) * 4) * vals[k]
        _sts_f32(s_red + t * 4, acc)
        cute.arch.sync_threads()
        tot = Float32(0.0)
        for w in cutlass.range_constexpr(nwarps):
            tot = tot + _lds_f32(s_warp + w * 4)
        inv = Float32(0.0)
        if tot > Float32(0.0):
            inv = _rcp(tot)
        if part == 0:
            o = Float32(0.0)
            for pp in cutlass.range_constexpr(MERGE_PARTS):
                o = o + _lds_f32(s_red + (pp * d + ch) * 4)
            oel = Int64(b) * Int64(o_stride_b) + Int64(qh) * Int64(o_stride_h) + Int64(ch)
            _store_kind(o_ptr, oel, o * inv, out_kind)
        if t == 0:
            lse = Float32(NEG_INF)
            if tot > Float32(0.0):
                lse = (mx + _lg2(tot)) * Float32(math.log(2.0))
            _stg_f32(lse_ptr + row * 4, lse)


def compile_merge(config: Int2DecodeConfig):
    """``cute.compile`` the split-merge launcher for ``config`` (its ``head_dim``);
    arguments :data:`~oscar_kernels.cute.config.MERGE_PTR_ARGS` (int64),
    :data:`~oscar_kernels.cute.config.MERGE_INT_ARGS` (int32) and the stream."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from cutlass.runtime import make_fake_stream

    op = Int2DecodeMergeSm90(config)
    z64, z32 = Int64(0), Int32(0)
    return cute.compile(op, *([z64] * len(MERGE_PTR_ARGS)), *([z32] * len(MERGE_INT_ARGS)),
                        make_fake_stream())
