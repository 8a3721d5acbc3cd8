"""CuTe DSL Hopper kernels: the fast path of :mod:`oscar_kernels.ops` (``backend="cute"``).

Implements ``decode`` (INT2/BF16 paged decode attention, :mod:`.int2_decode_sm90`) on sm_90;
``append`` and ``extend`` raise :class:`UnsupportedConfigError` so ``backend="auto"`` falls
back to Triton. Kernels JIT-compile when ``nvidia-cutlass-dsl`` is installed, else come from
the prebuilt bundle (:mod:`._bundle`, built by ``python -m oscar_kernels.cute.aot build``).

Importing this module needs neither torch's CUDA nor cutlass.
"""

from __future__ import annotations

import math
import os
import threading
import weakref

from ..errors import BackendUnavailableError, UnsupportedConfigError, expect
from . import _bundle

#: Largest GQA ratio (query heads per KV head): the QK MMA has 16 rows, 8 used.
MAX_GROUP = 8
#: GQA ratios up to this run the ``decode_pair`` kernel (query heads in MMA columns 0-3 and
#: again 4-7, two chunks per softmax pass).
PAIR_MAX_GROUP = 4
#: Tokens per chunk. With pages of a multiple of CHUNK tokens a chunk lies inside one page
#: (one row per chunk); other page sizes run the ``*_anypage`` build (a row per token).
CHUNK = 16
#: Resident warps per SM the split heuristic plans for, and the kernels' launch bound (128
#: registers per thread: 65536 / (128 x 32)); a CTA of 4 warps -> 4 CTAs per SM.
SM_WARPS = 16
#: Warps per CTA of the decode kernels: 4, or 8 (the wide build, head_dim 128 only; see
#: :func:`plan`).
CTA_WARPS = (4, 8)
#: Least fill of the single wave the split heuristic accepts before adding a split.
WAVE_FILL = 0.8
#: A single wave of 4-warp CTAs takes fewer splits when that lowers the busiest SM's load by
#: at least this fraction (see :func:`busiest_sm_splits`).
BUSY_MIN_GAIN = 0.05
#: ... and the pair kernel's single wave of 4-warp CTAs (fused tail) is planned instead of
#: the wide build's single wave when its busiest SM holds more than this fraction less of a
#: sequence (see :func:`busiest_sm_load` and :func:`plan`).
WIDE_BUSY_MARGIN = 0.10
MAX_SPLITS = 128
#: The kernel's last CTA of a (sequence, KV head) merges the splits, un-rotates and stores o
#: when ``num_splits * group <= FUSED_TAIL_ROWS`` (one launch in all; 4-warp builds with one
#: split store o directly); above it the merge
#: is a second kernel spread over (sequence, query head) CTAs (one CTA cannot pull that
#: many partials fast: measured 47 us vs 37 us for Llama-3-70B TP8 batch 1 at 8K).
FUSED_TAIL_ROWS = 128
#: The wide build (8 warps per CTA) is planned only where its fused tail merges at most this
#: many partial rows per (sequence, KV head): two 32-row round trips (see :func:`plan`).
WIDE_MAX_ROWS = 64
#: ... and, for ``decode`` (GQA > 4), up to this many: 2.5 round trips still beat 4-warp CTAs
#: there (session 22, alternating rounds, perf/results/2026-12-02_h200_s22_plan_*):
#: llama3-70b-tp8 batch 26-29 (80 / 72 rows: 8 x 10, 8 x 9) 0.4-5.4 % faster at 8K-128K
#: (batch 25 1-2 % at 32K-128K, 0.7 % slower at 8K), while 88 and 96 rows lost up to 10 % at
#: 8K (batch 21-23) and won 1-3 % at 128K.
WIDE_MAX_ROWS_DECODE = 80
#: ... and, for the pair kernel, with the splits capped at WIDE_MAX_ROWS // group when the
#: wide plan's tail would be longer, if that leaves at least this many CTAs per SM (see plan)
CAPPED_MIN_FILL = 7 / 8
#: Splits from which a single-wave wide pair call runs the merge-CTA build (see
#: :func:`use_merge_ctas`): batch 1's capped plan (16 splits) gained, batch 2-3 did not.
MERGE_CTA_MIN_SPLITS = 16
#: Splits from which a wide pair call runs the 4-deep ring build (see :func:`use_ring4`;
#: also with one split). 8 until session 20, when the ring-4 builds' unmasked K operands
#: made 5-6 splits (qwen3-8b batch 5-6) and one split (batch 27-33) faster with it.
RING4_MIN_SPLITS = 5
#: A length hint (``max_kv_len``: the longest sequence of the call, known to the caller on
#: the host; see :func:`short_splits` and :func:`use_ring4`): a single wave of two CTAs per SM
#: is planned for one CTA per SM when a warp's share of the longest sequence is below this
#: many tokens, by CTA width (warps per CTA; a CTA's fixed costs then outweigh a second
#: CTA's share of the SM) ...
SHORT_WARP_TOKENS = {8: 192, 4: 120}
#: ... and the one-CTA-per-SM plan still fills this fraction of the SMs.
SHORT_MIN_FILL = 0.7
#: ... and a pair call (head_dim 128) runs the 4-deep ring build when a warp's share of the
#: longest sequence is at most this many tokens, by CTA width (warps per CTA).
RING4_WARP_TOKENS = {8: 1024, 4: 512}
#: ... and the wide single wave is kept against a lighter 4-warp one (WIDE_BUSY_MARGIN) when
#: a wide warp's share of the longest sequence is at most this many tokens (see :func:`plan`).
WIDE_SHORT_WARP_TOKENS = 512
#: Depths of each warp's cp.async ring (chunks in flight per warp): see :func:`ring_depth`
DEEP_STAGES = 8
SHALLOW_STAGES = 4
HEAD_DIMS = (64, 128)
#: A BF16 window chunk in INT2 chunks when the kernel balances its warps' ranges (warp w runs
#: window chunks w, w + warps * num_splits, ..; its INT2 range is shorter by this much per
#: window chunk): the bytes of a window chunk (16 tokens x head_dim x 2 x 2 B) over an INT2
#: chunk's (2 x 16 x head_dim / 4 + 2 x 16 x 4 B), 7.1 at head_dim 128; 4, 7, 10 and 14
#: measured in session 8 (perf/results/2026-11-29_h200_s8_ab_win_cost_*).
WINDOW_CHUNK_COST = 7
#: Split shares of the wide build in a single wave: a split whose CTA is the first one
#: dispatched to its SM (rank 0: CTA index < #SMs, the grid is split-major) weighs
#: RANK0_WEIGHT, the others RANK_WEIGHT (the first CTA of an SM gets more issue slots: its
#: INT2 loop ran ~1.2x faster with equal shares, perf/results/2026-11-29_h200_trace_decode_*
#: _6edb004.json, and its rank-1 partner also starts its loop later). 5/4 in session 9; the
#: session-10 trace (..._trace_decode_*_85a32f1.json) still had rank-1 loops ending 6-11 %
#: later, and 3/2 measured 1-2 % faster than 5/4 (qwen3-8b batch 8, llama3-70b-tp8 batch
#: 64 / 128), 7/4 and 2/1 slower (perf/results/2026-11-29_h200_s10_ab_rank_weight*.txt).
#: Not in a full wave (#CTAs == 2 x #SMs): the dispatch pairs CTAs otherwise there and equal
#: shares were 10-15 % faster (session 22, perf/results/2026-12-02_h200_s22_*).
RANK0_WEIGHT = 3
RANK_WEIGHT = 2
#: ... only when every warp's range is at least this many INT2 chunks (and covers twice its
#: window work: 2 x WINDOW_CHUNK_COST = 14 chunks with one window chunk per warp). 32 with
#: 5/4 weights (session 9: shorter ranges measured up to 3 % slower); with 3/2, 8 was as
#: fast as 16 and 24 or faster: qwen3-8b batch 8 / 16K 3 %, llama3-70b-tp8
#: batch 64 / 8K-16K 2-4.5 % faster than session 9's rule (..._s10_ab_rank_min_chunks.txt,
#: ..._s10_ab_rank_short.txt).
RANK_MIN_CHUNKS = 8
#: ... and only with at most this many splits (the grid is split-major then, else
#: (split, head, sequence)). 4 in session 9 (the split-major order alone measured 1-3.5 %
#: slower with 8-16 splits, ..._s9_ab_grid_order*.txt); with the 3/2 weights 8 splits gain
#: at 32K and longer (llama3-70b-tp8 batch 32 2.5-3.2 %, qwen3-8b batch 4 4 %) and lose at
#: 8K-16K (llama3-70b-tp8 batch 32 3-7 %, qwen3-8b batch 4 / 8K 2 %), where the ranges are
#: too short for the weights and only the order changes.
RANK_MAX_SPLITS = 8
#: Byte offset of the debug trace slots in the ticket buffer (``OSCAR_CUTE_DEBUG=trace``
#: builds, ``OSCAR_CUTE_TRACE=1`` hosts: perf/trace_decode.py).
TRACE_OFFSET = 1 << 18
#: Per-warp trace slots (16 B per warp) start this far past the CTA slots (128 B per CTA).
TRACE_WARP_OFFSET = 8 << 20
def _kind(dtype) -> int:
    """The kernels' element kind of a q/out dtype: 0 float32, 1 bf16, 2 fp16."""
    import torch

    return {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype]


#: The any-page build finds a token's page with float arithmetic, exact for positions below
#: this (a cache of at most this many token slots).
ANY_PAGE_MAX_SLOTS = 1 << 24


def _check_cache_size(spec, num_pages: int) -> None:
    """The cache sizes the kernels index correctly (UnsupportedConfigError otherwise)."""
    rows = num_pages * spec.page_size * spec.num_kv_heads
    if rows >= 2 ** 31:
        raise UnsupportedConfigError(
            f"cache: the CuTe kernel indexes (page, slot, head) rows in int32; "
            f"num_pages * page_size * num_kv_heads = {rows}")
    slots = num_pages * spec.page_size
    if spec.page_size % CHUNK != 0 and slots > ANY_PAGE_MAX_SLOTS:
        raise UnsupportedConfigError(
            f"cache: with pages of {spec.page_size} tokens (not a multiple of {CHUNK}) the CuTe "
            f"kernel supports up to {ANY_PAGE_MAX_SLOTS} token slots (num_pages * page_size), "
            f"got {slots}")


def can_implement(op: str, *, device, spec, num_qo_heads: int, dtype,
                  num_pages: int | None = None) -> None:
    """Raise unless this backend can run ``op`` for this config on ``device`` (and, when
    given, a cache of ``num_pages`` pages)."""
    import torch

    if op != "decode":
        raise UnsupportedConfigError(f"the CuTe backend implements decode only, not {op!r}")
    if spec.head_dim not in HEAD_DIMS:
        raise UnsupportedConfigError(f"head_dim: CuTe kernels exist for {HEAD_DIMS}, got {spec.head_dim}")
    if spec.group_size != spec.head_dim:
        raise UnsupportedConfigError(
            f"group_size: the CuTe kernel needs one group per head (group_size == head_dim == "
            f"{spec.head_dim}), got {spec.group_size}")
    if spec.scale_dtype != torch.float16:
        raise UnsupportedConfigError(f"scale_dtype: the CuTe kernel needs torch.float16, got {spec.scale_dtype}")
    group = num_qo_heads // spec.num_kv_heads
    if not 1 <= group <= MAX_GROUP:
        raise UnsupportedConfigError(
            f"num_qo_heads: GQA ratio 1..{MAX_GROUP} supported, got {num_qo_heads}/"
            f"{spec.num_kv_heads} = {group}")
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise UnsupportedConfigError(f"dtype: bf16, fp16 or fp32 queries, got {dtype}")
    if num_pages is not None:
        _check_cache_size(spec, num_pages)
    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        raise BackendUnavailableError(f"the CuTe backend needs a CUDA sm_90 device, got {device}")
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        raise BackendUnavailableError(f"the CuTe backend needs sm_90 (H100/H200), got sm_{cap[0]}{cap[1]}")
    dims = _bundle.available_head_dims()
    if spec.head_dim not in dims:
        raise BackendUnavailableError(f"head_dim: this build holds CuTe kernels for {dims} only, got {spec.head_dim}")
    any_page = spec.page_size % CHUNK != 0
    if any_page and not _bundle.has_kernel(decode_op(group, any_page), spec.head_dim):
        raise UnsupportedConfigError(
            f"page_size: this CuTe build has kernels for multiples of {CHUNK} only (a bundle "
            f"before the any-page build), got {spec.page_size}")


def ring_depth(head_dim: int, pair: bool, merge_ctas: bool = False) -> int:
    """The cp.async ring depth of a decode build that does not set its own
    (``Int2DecodeConfig.stages`` 0; the kernel's ``default_stages``, which also honours the
    ``OSCAR_CUTE_STAGES`` experiment switch): SHALLOW_STAGES for the merge-CTA build
    (session 16) and for ``decode`` (GQA > 4) at head_dim 128 (4 or 8 warps, also any-page;
    session 17), else DEEP_STAGES. The pair kernel's 4-deep builds (``decode_pair_ring4``)
    set theirs; :func:`use_ring4` picks them. The measurements are in ``default_stages``."""
    return SHALLOW_STAGES if merge_ctas or (head_dim == 128 and not pair) else DEEP_STAGES


def num_splits_for(batch_size: int, num_kv_heads: int, num_sms: int, group: int = 1,
                   warps: int = 4, head_dim: int | None = None) -> int:
    """CTAs per (sequence, KV head) for CTAs of ``warps`` warps: as many as fit in one wave
    of ``SM_WARPS // warps`` CTAs per SM (rounded down: a second, partly filled wave of long
    CTAs costs more than it brings; measured with 4 warps: qwen3-8b batch 8 at 32K: 8
    splits 0.112 ms vs 9 splits 0.128 ms; llama3-70b-tp8 batch 128 at 128K: 4 splits 0.606
    ms vs 5 splits 0.635 ms). When the last wave of that
    choice would be less than ``WAVE_FILL`` full, the KV is split finer, into about four
    waves of shorter CTAs that balance over the SMs (qwen3-8b at 100K on an H200: batch 50,
    400 CTAs on 528 slots, 2 / 6 splits 1.088 / 0.987 ms; batch 100, 1.5 waves, 1 / 3 / 4
    splits 2.139 / 1.921 / 1.901 ms). A single wave whose partials go to the merge kernel
    anyway (``splits * group > FUSED_TAIL_ROWS``, batch 1-16 with few KV heads) is planned
    for one CTA per SM fewer: fewer, longer CTAs start faster and leave fewer partials
    (H200, two rounds each: qwen3-8b batch 1 at 8K-128K 49 vs 66 splits 0.6-1.4 us faster,
    llama3-70b-tp8 batch 8 at 64K/128K 0.8-1.8 us faster;
    perf/results/2026-11-29_h200_session6_split_sweeps_b1.txt).

    Since session 17 ``decode`` (GQA > 4) at ``head_dim`` 128 with 4 warps has a 4-deep ring
    and such a wave is planned for two CTAs per SM fewer, when its partials still go to the
    merge kernel (else one fewer, as before): llama3-70b-tp8 batch 4 66 vs 99 splits 0.4-1.9
    us faster at 8K-128K, batch 8 33 vs 49 splits 0.6-1 us at 8K-64K and even at 128K, batch
    12 22 vs 33 splits 0.9-1.6 us faster at 8K-32K, even at 64K, 0.9 us slower at 128K;
    batch 16 keeps 24 (16 splits land on a 128-row fused tail: 8-11 us slower);
    perf/results/2026-12-02_h200_s17_sweep_llama_*_248b149.txt.

    No rounding down to the fused tail's limit: that always lands on a 128-row tail, which
    is slower than the merge kernel (qwen3-8b batch 2: 32 splits with the fused tail 39.5 /
    72.5 us at 32K / 128K, 33 splits and the merge kernel 33.2 / 65.0 us).

    Since session 22 a single wave of 4-warp CTAs with the fused tail takes fewer splits
    where the busiest SM then holds less work (:func:`busiest_sm_splits`).

    Depends on shapes only (never on sequence lengths), so decode stays graph-capturable.
    """
    per_sm = SM_WARPS // warps
    slots = per_sm * num_sms
    rows = batch_size * num_kv_heads
    want = max(1, slots // rows)
    waves = rows * want / slots
    if waves / math.ceil(waves) < WAVE_FILL:   # the last wave would stay too empty
        want = max(want + 1, math.ceil(4 * slots / rows))
    elif want * group > FUSED_TAIL_ROWS:      # one wave, partials through the merge kernel
        ring4_decode = (warps == 4 and group > PAIR_MAX_GROUP and head_dim is not None
                        and ring_depth(head_dim, pair=False) == SHALLOW_STAGES)
        for free in (2, 1) if ring4_decode else (1,):
            light = max(1, (per_sm - free) * num_sms // rows)
            if light * group > FUSED_TAIL_ROWS:
                want = min(want, light)
                break
    elif warps == 4 and rows * want <= slots:  # one wave of 4-warp CTAs, fused tail
        want = busiest_sm_splits(rows, want, num_sms)
    return max(1, min(MAX_SPLITS, want))


def busiest_sm_load(rows: int, num_splits: int, num_sms: int) -> float:
    """Sequences' worth of KV the busiest SM holds when ``rows * num_splits`` equal CTAs
    (``1 / num_splits`` of a sequence each) spread evenly over ``num_sms`` SMs:
    ``ceil(rows * num_splits / num_sms) / num_splits``. Compares plans of either CTA width."""
    return math.ceil(rows * num_splits / num_sms) / num_splits


def busiest_sm_splits(rows: int, num_splits: int, num_sms: int) -> int:
    """Splits for a single wave of ``rows * num_splits`` 4-warp CTAs: the call ends with
    the busiest SM, which holds ``ceil(rows * s / num_sms)`` CTAs of ``1 / s`` of a
    sequence each. Returns the ``s`` in ``[num_splits // 2, num_splits]`` with the least
    such load when it is at least ``BUSY_MIN_GAIN`` below ``num_splits``' (the larger on
    ties), else ``num_splits``. E.g. llama3-70b-tp8 batch 89: 5 splits put 4 CTAs of 1/5 on
    49 SMs (0.8 of a sequence), 4 splits at most 3 of 1/4 (0.75). Measured on an H200
    (session 22, alternating rounds, perf/results/2026-12-02_h200_s22_plan_*): 4 splits
    against 5 at llama3-70b-tp8 batch 89 / 95 / 99 3.2-4.2 / 5.8-6.5 / 3.5-5 % faster at 8K /
    32K / 128K, smollm2 batch 30 / 33 2.3-2.9 %, qwen3-8b batch 12 1.3-2.5 % at 32K-128K
    (0.5 % slower at 8K); 5 against 6 at smollm2 batch 26 6.3-6.7 %."""
    def load(s: int) -> float:
        return busiest_sm_load(rows, s, num_sms)

    best = min(range(max(1, num_splits // 2), num_splits + 1), key=lambda s: (load(s), -s))
    return best if load(best) <= (1 - BUSY_MIN_GAIN) * load(num_splits) else num_splits


def plan(batch_size: int, num_kv_heads: int, num_sms: int, group: int, head_dim: int,
         wide_available: bool = True, max_kv_len: int | None = None) -> tuple[int, int]:
    """``(warps, num_splits)`` of a decode call: from the shapes, then (with the length hint
    ``max_kv_len``) :func:`short_splits`; the hint also keeps the wide plan for short
    sequences where the shapes alone pick a lighter 4-warp wave (session 23).
    Graph-capturable either way (a captured launch keeps its plan; any plan is correct for
    any length).

    The wide build (8 warps per CTA, 2 CTAs per SM, head_dim 128) runs when its own plan is
    a single wave whose partials the fused tail merges in at most ``WIDE_MAX_ROWS`` rows
    per (sequence, KV head) (``WIDE_MAX_ROWS_DECODE`` for GQA > 4, since session 22);
    otherwise CTAs of 4 warps. Half as many CTAs per SM then share
    an SM's issue slots, and the per-CTA work of a single wave (query rotation, combine,
    partial stores; all at the same moment on every SM) halves per SM. Measured on an H200
    (``cute.bench --warps 4|8``, alternating rounds; perf/results/2026-11-29_h200_s9_ab_w8_*,
    ..._s9_warps_sweep.txt, ..._s9_warps_small_batch.txt), 8 vs 4 warps:

    * faster: qwen3-8b batch 2-32 (2-9 %, e.g. batch 8 / 64K 99 -> 95 us), llama3-70b-tp8
      batch 32-256 (4-18 %);
    * slower, so not taken: qwen3-8b batch 1 and llama3-70b-tp8 batch 8-16 (the wide plan's
      132-264 rows, or 128 rows in four fused round trips, against the merge kernel:
      +2-9 %), and several waves of wide CTAs (qwen3-8b batch 50 / 100 +2-7 %, batch 64 / 128
      at 8K +3-8 %; batch 64 / 128 at 100K 3-5 % faster, but the plan cannot see lengths);
    * head_dim 64 keeps 4 warps (its 4 M tiles of the rotations cannot feed 8 warps).

    Session 23: the pair kernel (GQA <= 4) keeps its 4-warp plan when that is a single
    wave with the fused tail whose busiest SM holds more than ``WIDE_BUSY_MARGIN`` less of a
    sequence than the wide plan's (:func:`busiest_sm_load`; the wide build halves the
    per-CTA work, which the load does not count). Measured on an H200 (alternating rounds,
    perf/results/2026-12-02_h200_s23_*), 4 against 8 warps: qwen3-8b batch 9 (4 x 7 against
    8 x 3, 14 % less load) 7-9 % faster at 32K-128K, even at 8K; batch 7 (4 x 9 against 8 x 4,
    11 %) 3-6 % faster at 32K-128K, 5 % slower at 8K; llama2-7b-tp4 (MHA) batch 7 / 9 2.5-5.5 /
    5-10 % faster at 8K-128K; but qwen3-8b batch 6 (9 %) 2-4 % faster at 64K-128K, 2-4 / 15 %
    slower at 32K / 8K, batch 5 (8 %) and the ties (batch 4, 8, 10-16) slower or within 2.5 %.
    ``decode`` (GQA 8) stays wide: llama3-70b-tp8 batch 54-58 (11 %) 1-19 % slower at
    8K-64K, batch 72 (14 %) 3-6 % faster at 64K-128K but 12 % slower at 8K. With the length
    hint the wide plan (then with its 4-deep ring) stays where a wide warp's share of the
    longest sequence is at most ``WIDE_SHORT_WARP_TOKENS``: qwen3-8b batch 7 12-20 % faster
    at 2K-8K and 7 % at 16K (512 tokens per warp), 1.4 % slower at 32K; batch 9 6.5-15 %
    faster at 2K-8K (341 per warp), 2 % slower at 16K; llama2-7b-tp4 batch 7 9 % faster at
    2K, within 2.5 % at 4K-16K, batch 9 6 % faster at 2K, 1-5 % slower at 4K-16K.

    Session 10: where the wide plan would need more than ``WIDE_MAX_ROWS`` rows, ``decode_pair``
    (GQA <= 4) takes ``WIDE_MAX_ROWS // group`` splits instead, fused tail and no merge kernel,
    when that still makes ``CAPPED_MIN_FILL`` x #SMs CTAs or more: qwen3-8b batch 1 (128 CTAs
    of 16 splits) 5-8.5 % faster at 8K-64K and 1 % at 128K than 4 warps x 49 splits and the
    merge kernel (perf/results/2026-11-29_h200_s10_split_sweep_*). ``decode`` (GQA 8) keeps
    4 warps: llama3-70b-tp8 batch 16 with 8 wide splits was 9 % faster at 8K but 3 % slower at
    128K, batch 12 (96 CTAs) up to 22 % slower.
    """
    rows = batch_size * num_kv_heads
    hint = _length_hint(max_kv_len)
    warps, splits = 4, num_splits_for(batch_size, num_kv_heads, num_sms, group,
                                      head_dim=head_dim)
    if head_dim == 128 and wide_available:
        wide = num_splits_for(batch_size, num_kv_heads, num_sms, group, warps=8)
        one_wave = rows * wide <= (SM_WARPS // 8) * num_sms
        # the pair kernel with fewer splits than a full wave: the fused tail at WIDE_MAX_ROWS
        # rows instead of the merge kernel, while about one wide CTA per SM remains
        capped = WIDE_MAX_ROWS // group
        max_rows = WIDE_MAX_ROWS if group <= PAIR_MAX_GROUP else WIDE_MAX_ROWS_DECODE
        # the pair kernel's 4-warp single wave (fused tail) when it loads the busiest SM
        # more than WIDE_BUSY_MARGIN less than the wide single wave (session 23; strictly:
        # the 1e-9 keeps an exact 10 %, e.g. 3/5 against 2/3, wide)
        narrow = (group <= PAIR_MAX_GROUP and rows * splits <= (SM_WARPS // 4) * num_sms
                  and splits * group <= FUSED_TAIL_ROWS
                  and busiest_sm_load(rows, splits, num_sms)
                  < (1 - WIDE_BUSY_MARGIN) * busiest_sm_load(rows, wide, num_sms) - 1e-9
                  and (hint is None or hint > WIDE_SHORT_WARP_TOKENS * 8 * wide))
        if one_wave and wide * group <= max_rows and not narrow:
            warps, splits = 8, wide
        elif (group <= PAIR_MAX_GROUP and capped < wide
                and CAPPED_MIN_FILL * num_sms <= rows * capped <= (SM_WARPS // 8) * num_sms):
            warps, splits = 8, capped
    return warps, short_splits(rows, warps, splits, num_sms, group, max_kv_len)


def _length_hint(max_kv_len: int | None) -> int | None:
    """``max_kv_len``, or ``None`` when ``OSCAR_CUTE_LENGTH_HINT=0`` turns the hint off."""
    return None if os.environ.get("OSCAR_CUTE_LENGTH_HINT") == "0" else max_kv_len


def short_splits(rows: int, warps: int, num_splits: int, num_sms: int, group: int,
                 max_kv_len: int | None) -> int:
    """The split count of a planned call (``rows`` (sequence, KV head) pairs, CTAs of
    ``warps`` warps) given the length hint ``max_kv_len`` (the longest sequence, tokens;
    ``None``: ``num_splits`` as planned from the shapes). A single wave of more than one and
    at most two CTAs per SM becomes one CTA per SM (``num_sms // rows`` splits) when

    * a warp's share of the longest sequence, ``max_kv_len / (warps * num_splits)``, is below
      ``SHORT_WARP_TOKENS[warps]``,
    * the new grid fills at least ``SHORT_MIN_FILL`` of the SMs, and
    * the partials keep their merge path (fused tail or merge kernel: llama3-70b-tp8 batch 8
      would land on the 128-row fused tail).

    Measured on an H200 (session 21, alternating rounds, perf/results/2026-12-02_h200_s21_*):
    the one-CTA-per-SM plans against the shapes' ones, e.g. qwen3-8b batch 2 (8 against 16
    wide splits) 8-16 % faster at 2K-8K and 4 % at 16K, even from 32K (a warp's share 256
    tokens); batch 3 (5 / 11) 12-15 % at 2K-8K, even at 16K, slower at 32K; llama3-70b-tp8
    batch 2-7 (4 warps, 66 / 128 splits at batch 2) 5-12 % faster at 2K-16K, even or up to
    5 % slower from a warp's share of ~124 tokens (batch 3 / 64K 186: 5 % slower); batch 32
    (4 / 8 wide splits) 7-12 % faster at 2K-8K, even at 16K. Not taken: four 4-warp CTAs per
    SM (smollm2 batch 8-32, qwen3-8b batch 12: up to 40 % slower with one), a third of the
    SMs left empty (qwen3-8b batch 10: 80 CTAs, 3 % slower). ``OSCAR_CUTE_LENGTH_HINT=0``
    ignores the hint (benchmarks)."""
    max_kv_len = _length_hint(max_kv_len)
    if max_kv_len is None:
        return num_splits
    one = num_sms // rows
    if not (num_sms < rows * num_splits <= 2 * num_sms and 1 <= one < num_splits
            and rows * one >= SHORT_MIN_FILL * num_sms
            and max_kv_len < SHORT_WARP_TOKENS[warps] * warps * num_splits
            and (num_splits * group > FUSED_TAIL_ROWS) == (one * group > FUSED_TAIL_ROWS)):
        return num_splits
    return one


def use_merge_ctas(rows: int, num_splits: int, num_sms: int, group: int) -> bool:
    """Whether a wide-build call with ``rows`` (sequence, KV head) pairs of ``num_splits``
    splits runs the merge-CTA build (``decode_pair_mc``): GQA <= 4, at least
    ``MERGE_CTA_MIN_SPLITS`` splits merged in the fused tail, and the split CTAs plus one
    merge CTA per pair in one wave (a merge CTA waits for its pair's splits, which the
    split-major grid dispatches before it; in one wave all are resident anyway). Measured
    on an H200 (perf/results/2026-12-01_h200_s13_ab_mc_dde782e.txt, 3 rounds): qwen3-8b
    batch 1 (16 splits) 1.1 / 0.5 / 0.4 / 0 us faster at 8K / 32K / 64K / 128K, batch 2-3
    (8 and 5 splits) 0.2-0.6 us slower, batch 4 within noise; hence batch 1's plan only.
    ``OSCAR_CUTE_MERGE_CTAS=0|1`` overrides the choice (benchmarks)."""
    force = os.environ.get("OSCAR_CUTE_MERGE_CTAS")
    ok = (group <= PAIR_MAX_GROUP and 1 < num_splits and num_splits * group <= FUSED_TAIL_ROWS)
    if force is not None:
        return ok and force == "1"
    return (ok and num_splits >= MERGE_CTA_MIN_SPLITS
            and rows * (num_splits + 1) <= (SM_WARPS // 8) * num_sms)


def use_ring4(rows: int, num_splits: int, num_sms: int, warps: int,
              max_kv_len: int | None = None) -> bool:
    """Whether a ``decode_pair`` call (GQA <= 4, head_dim 128, pages of multiples of CHUNK
    tokens) of ``rows`` (sequence, KV head) pairs runs ``decode_pair_ring4``, the pair kernel
    with a 4-deep cp.async ring instead of 8: with 8 warps from ``RING4_MIN_SPLITS`` splits
    or with one split, with 4 warps when the grid is one wave. Since session 20 the ring-4
    builds run the int8 QK on unmasked K operands and ``decode_pair_w8`` does not
    (``k_operand_form``); against it, in alternating rounds on an H200
    (perf/results/2026-12-02_h200_s20_ab_ring4_b8_32b981a.txt): qwen3-8b batch 5 (6 wide
    splits) 2.1 / 1.6 / 0.9 us faster at 32K / 64K / 128K, batch 32 (one split) 2.4-2.9 %,
    batch 8 (4 splits) 0.4 / 1.6 us faster at 32K / 64K but 2 us (1.3 %) slower at 128K and
    batch 16 (2 splits) 1.5 us faster at 32K, 1.7 / 0.7 us slower at 64K / 128K, so those keep
    8 stages. Session 17 (every build at 4 against 8 stages, masked K, alternating rounds,
    perf/results/2026-12-02_h200_s17_ab_st4_*_1ab0693.txt):

    * faster: qwen3-8b batch 2 (16 wide splits) 3.1-3.9 us per call (32K 26.2-26.5 vs
      29.0-30.1), batch 3 (11 splits) 1.8-4.3 us, batch 4 (8 splits) 0-2.2 us, batch 12-13
      (4 warps x 5 splits, one wave) 1.7-3.7 us at 8K-64K and 2.4-3 % at 128K, batch 64 (4
      warps, 512 CTAs in one wave) 2.5-3.5 % at 8K-128K;
    * slower, so 8 stages there: qwen3-8b batch 5-6 (6 / 5 wide splits) up to 1.8 / 5 us
      at 64K-128K though faster at 8K (..._s17_ab_ring4_qwen_mid_1bbc8cc.txt), batch 8-16
      (4 and 2 wide splits) 3-4 % at 128K, batch 128 (4 warps, two waves) 5 % at 128K
      though 1-3 % faster at 8K-64K; batch 32 (one wide split) within 1 %.

    The rule follows the batch shape (``num_sms`` is read for 4 warps only); with the length
    hint ``max_kv_len`` (session 21) also short sequences take the 4-deep ring: when a warp's
    share of the longest sequence, ``max_kv_len / (warps * num_splits)``, is at most
    ``RING4_WARP_TOKENS[warps]`` (perf/results/2026-12-02_h200_s21_ring_*, split plans forced,
    alternating rounds): qwen3-8b batch 8 (4 wide splits) 1.2-2.6 / 2.0 / 0.7 us faster at 8K
    / 16K / 32K, even at 48K, 0.2-0.8 / 1 / 3 us slower at 64K / 96K / 128K; batch 10 (3
    splits) 1.5 us faster at 8K-16K, even at 32K-48K; batch 16 (2 splits) 1.2-2.5 us faster
    at 4K-8K, even at 16K-32K, slower from 48K; batch 24 (4 warps x 11 splits, four waves)
    3.5 / 2 us faster at 8K / 16K, 2-5 us slower at 32K-64K; batch 48 (4 x 6) 4 us faster at
    8K, slower from 16K. The merge-CTA build, when it runs, has a 4-deep ring of its own.
    ``OSCAR_CUTE_RING4=0|1`` overrides the rule (benchmarks)."""
    force = os.environ.get("OSCAR_CUTE_RING4")
    if force is not None:
        return force == "1"
    max_kv_len = _length_hint(max_kv_len)
    if max_kv_len is not None and max_kv_len <= RING4_WARP_TOKENS[warps] * warps * num_splits:
        return True
    if warps == 8:
        return num_splits >= RING4_MIN_SPLITS or num_splits == 1
    return rows * num_splits <= (SM_WARPS // warps) * num_sms


def launch_op(batch_size: int, h: int, group: int, head_dim: int, warps: int,
              num_splits: int, device, any_page: bool = False,
              merge_ctas: bool | None = None, ring4: bool | None = None,
              max_kv_len: int | None = None) -> str:
    """The bundle op a planned call on ``device`` launches: :func:`decode_op`,
    ``decode_pair_mc`` where the merge-CTA build runs (:func:`use_merge_ctas`, or forced by
    ``merge_ctas``), else ``decode_pair_ring4`` where the 4-deep ring build runs
    (:func:`use_ring4` when the bundle has it, with the length hint ``max_kv_len``, or
    forced by ``ring4``). Typed errors for what the builds cannot run."""
    use_merge = num_splits * group > FUSED_TAIL_ROWS
    if use_merge and warps == 8:
        # its partials stay in the rotated space for the fused tail; the merge kernel takes
        # partials in the model's space (4-warp builds apply R_V^T before storing them)
        raise UnsupportedConfigError(
            f"num_splits: the 8-warp build merges at most {FUSED_TAIL_ROWS} partial rows "
            f"(num_splits x GQA ratio {group}) in its fused tail, got {num_splits} splits")
    op = decode_op(group, any_page)
    # single-wave shapes: one more CTA per (sequence, KV head) merges its splits
    # (Int2PagedDecodeSm90._merger); the same arguments
    mc_ok = (warps == 8 and op == "decode_pair" and 1 < num_splits and not use_merge
             and _bundle.has_kernel("decode_pair_mc", head_dim, 8))
    if merge_ctas and not mc_ok:
        raise UnsupportedConfigError(
            "merge_ctas: the merge-CTA build runs GQA <= 4 with 8 warps, 2 or more splits "
            f"merged in the fused tail, from a bundle that has it; got GQA {group}, {warps} "
            f"warps, {num_splits} splits")
    if mc_ok and (use_merge_ctas(batch_size * h, num_splits, _num_sms(device), group)
                  if merge_ctas is None else merge_ctas):
        return "decode_pair_mc"
    ring4_ok = op == "decode_pair" and _bundle.has_kernel("decode_pair_ring4", head_dim, warps)
    if ring4 and not ring4_ok:
        raise UnsupportedConfigError(
            "ring4: the 4-deep ring build runs GQA <= 4 at head_dim 128 with pages of a "
            f"multiple of {CHUNK} tokens, from a bundle that has it; got GQA {group}, "
            f"head_dim {head_dim}, {warps} warps, any_page={any_page}")
    if ring4_ok and (use_ring4(batch_size * h, num_splits,
                               _num_sms(device) if warps == 4 else 0, warps, max_kv_len)
                     if ring4 is None else ring4):
        op = "decode_pair_ring4"
    return op


def _num_sms(device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_op(group: int, any_page: bool = False) -> str:
    """The bundle op that runs a GQA ratio: ``decode_pair`` up to ``PAIR_MAX_GROUP``, else
    ``decode``; ``*_anypage`` for pages that are not a multiple of ``CHUNK`` tokens."""
    return ("decode_pair" if group <= PAIR_MAX_GROUP else "decode") + (
        "_anypage" if any_page else "")


def wide_available(group: int, head_dim: int, any_page: bool = False) -> bool:
    """Whether this process has the wide (8-warp) build of the decode op for ``group``
    (never for the any-page build)."""
    return not any_page and _bundle.has_kernel(decode_op(group), head_dim, 8)


def _row_strides(spec) -> tuple[int, int, int]:
    """(page, slot, head) strides in rows of ``head_dim / 4`` code bytes."""
    if spec.kv_layout == "NHD":
        return spec.page_size * spec.num_kv_heads, spec.num_kv_heads, 1
    return spec.num_kv_heads * spec.page_size, 1, spec.page_size


def decode(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v,
           sm_scale, *, out=None, num_splits: int | None = None, warps: int | None = None,
           merge_ctas: bool | None = None, ring4: bool | None = None,
           max_kv_len: int | None = None):
    """Backend entry of :func:`oscar_kernels.ops.paged_decode_attention` (inputs validated).

    ``q [batch_size, num_qo_heads, head_dim]``; returns ``(o, lse)``: ``o`` of q's dtype in
    the model's space (written into ``out`` when given), ``lse [batch_size, num_qo_heads]``
    float32 natural log. No host synchronization; every launch is graph-capturable.
    ``warps`` / ``num_splits`` override :func:`plan` (tests, benchmarks); ``merge_ctas``
    forces the merge-CTA build (:func:`use_merge_ctas`) on or off for wide pair calls,
    ``ring4`` the 4-deep ring build (:func:`use_ring4`) for pair calls. ``max_kv_len``, the
    longest sequence's length in tokens, is a plan hint (:func:`short_splits`,
    :func:`use_ring4`): any value gives a correct result (another plan sums the splits in
    another order: float rounding, within the tests' tolerance), so a graph captured with one
    hint replays correctly at every length.
    """
    steps, result = decode_steps(q, cache, kv_indptr, kv_indices, kv_last_page_len,
                                 window_slots, rot_k, rot_v, sm_scale, out=out,
                                 num_splits=num_splits, warps=warps, merge_ctas=merge_ctas,
                                 ring4=ring4, max_kv_len=max_kv_len)
    for _, step in steps:
        step()
    return result()


def decode_steps(q, cache, kv_indptr, kv_indices, kv_last_page_len, window_slots, rot_k, rot_v,
                 sm_scale, *, out=None, num_splits: int | None = None, warps: int | None = None,
                 merge_ctas: bool | None = None, ring4: bool | None = None,
                 max_kv_len: int | None = None):
    """The launches of :func:`decode` as ``[(name, fn)]`` over buffers allocated here, plus
    a ``result()`` returning ``(o, lse)`` after they ran (used by the per-step benchmark).
    ``merge_ctas`` forces the merge-CTA build on or off for wide pair calls, ``ring4`` the
    4-deep ring build for pair calls (tests), ``max_kv_len`` is the plan's length hint."""
    import torch

    spec = cache.spec
    batch_size, num_qo_heads, d = q.shape
    h = spec.num_kv_heads
    group = num_qo_heads // h
    dev = q.device
    _check_cache_size(spec, cache.num_pages)
    expect(warps is None or isinstance(warps, int) and warps in CTA_WARPS
           and (warps == 4 or d == 128), "warps",
           "None, 4 or (head_dim 128) 8", warps)
    expect(num_splits is None or isinstance(num_splits, int) and 1 <= num_splits <= MAX_SPLITS,
           "num_splits", f"an int in [1, {MAX_SPLITS}]", num_splits)
    expect(max_kv_len is None or isinstance(max_kv_len, int) and not isinstance(max_kv_len, bool),
           "max_kv_len", "None or an int", max_kv_len, TypeError)
    expect(max_kv_len is None or max_kv_len >= 0, "max_kv_len", "a length >= 0", max_kv_len)
    any_page = spec.page_size % CHUNK != 0
    if any_page and warps == 8:
        raise UnsupportedConfigError(
            f"warps: pages of {spec.page_size} tokens (not a multiple of {CHUNK}) run the "
            "any-page build, which has CTAs of 4 warps only; got 8")
    if warps is None or num_splits is None:
        sms = _num_sms(dev)
        if warps is None:
            warps, planned = plan(batch_size, h, sms, group, d,
                                  wide_available(group, d, any_page), max_kv_len)
        else:
            planned = num_splits_for(batch_size, h, sms, group, warps, d)
            if warps == 8:      # the wide build merges in its fused tail only (below)
                planned = min(planned, max(1, FUSED_TAIL_ROWS // group))
        num_splits = planned if num_splits is None else num_splits
    op = launch_op(batch_size, h, group, d, warps, num_splits, dev, any_page, merge_ctas,
                   ring4, max_kv_len)
    use_merge = num_splits * group > FUSED_TAIL_ROWS
    o_part = torch.empty(batch_size, num_qo_heads, num_splits, d, dtype=torch.float32, device=dev)
    lse_part = torch.empty(batch_size, num_qo_heads, num_splits, dtype=torch.float32, device=dev)
    lse = torch.empty(batch_size, num_qo_heads, dtype=torch.float32, device=dev)
    # the kernel writes o in q's dtype straight into `out` when its last dim is contiguous
    o = out if out is not None and out.stride(-1) == 1 else torch.empty_like(q)
    if q.stride(-1) != 1:
        q = q.contiguous()

    # the rotations as fp16 tensor-core operands (cached per rotation tensor)
    rk_op, rk_stride = mma_operand(rot_k, transpose=True)
    rv_op, rv_op_stride = mma_operand(rot_v, transpose=False)
    counters = _counters(dev, batch_size * h)
    sp, ss, sh = _row_strides(spec)
    ptrs = [q, cache.k_codes, cache.k_params, cache.v_codes, cache.v_params, cache.k_window,
            cache.v_window, kv_indptr, kv_indices, kv_last_page_len, window_slots, o_part,
            lse_part, rk_op, rv_op, o, lse, counters]
    ints = [batch_size, h, group, spec.page_size, sp, ss, sh, spec.sink_size, spec.recent_size,
            num_splits, rk_stride, rv_op_stride, _kind(q.dtype), q.stride(0), q.stride(1),
            _kind(o.dtype), o.stride(0), o.stride(1)]
    scale_log2 = float(sm_scale) * math.log2(math.e)
    # GQA ratio <= 4: the kernel specialized to run two chunks per softmax pass; pages that
    # are not a multiple of CHUNK tokens: the any-page build
    kernel = _bundle.get_kernel(op, d, warps)

    def run_decode():
        # q @ R_K, attention over this CTA's split, then either (one split, or the merge
        # kernel next; 4-warp builds) o' @ R_V^T of its partial in the CTA (one split: the
        # store in q's dtype), or (fused tail) in the last CTA of each (sequence, KV head)
        # the split merge, o' @ R_V^T and the store in q's dtype
        with torch.cuda.device(dev):
            kernel(*[t.data_ptr() for t in ptrs], *ints, scale_log2,
                   torch.cuda.current_stream(dev).cuda_stream)

    def run_merge():
        with torch.cuda.device(dev):
            _bundle.get_kernel("merge", d)(
                o_part.data_ptr(), lse_part.data_ptr(), o.data_ptr(), lse.data_ptr(),
                batch_size, h, group, num_splits, _kind(o.dtype), o.stride(0), o.stride(1),
                torch.cuda.current_stream(dev).cuda_stream)

    steps = [("decode", run_decode)]
    if use_merge:
        steps.append(("merge", run_merge))
    if out is not None and o is not out:
        steps.append(("copy_out", lambda: out.copy_(o)))

    def result():
        return (out if out is not None else o), lse
    return steps, result


def unmasked_k_query(q, top_masked: bool = False):
    """The int8 QK's query for *unmasked* K operands (head_dim 128): ``q[i][j]`` is the
    query element of channel quarter ``i`` in byte ``j`` (0-3) of one 32-bit code word;
    returns ``Q[i][j]`` such that, with the operands ``u_i = w * 4^(3 - i) mod 2^32`` (no
    ``& 0xC0C0C0C0``: byte ``j`` of ``u_i`` also carries the lower quarters of byte ``j``,
    shifted, and the upper ones of byte ``j - 1``), ``sum_ij Q[i][j] byte_j(u_i) = 64
    sum_ij q[i][j] code_i(byte j)`` -- the same score as the masked fields ``64 * code``.

    Byte ``j`` of ``u_i`` is ``sum_{k <= i} c_kj 4^(k + 3 - i) + sum_{k > i} c_k,j-1
    4^(k - 1 - i)``, so code ``c_kj`` meets ``Q[i][j]`` (``i >= k``, weight ``4^(k + 3 -
    i)``) and ``Q[i][j + 1]`` (``i < k``, ``4^(k - 1 - i)``); asking for ``64 q[k][j]`` gives
    a triangular system, solved from byte 3 down and quarter 3 down (each ``Q`` its ``q``
    minus multiples ``<= 1/4`` of ones already known, at most ``1/4 + 1/16 + 1/64`` in all,
    so ``max|Q| <= max|q| / (1 - 0.33) < 1.5 max|q|``). Plain arithmetic on the elements,
    so the kernel traces it on its float32 registers and the tests run it on tensors.
    ``top_masked``: quarter 3's operand keeps its mask (``w & 0xC0C0C0C0``, 64 x the fields
    only), so only quarters 0-2 carry the other bits."""
    out = [[None] * 4 for _ in range(4)]
    for j in range(3, -1, -1):
        for k in range(3, -1, -1):
            x = q[k][j]
            for i in range(k + 1, 3 if top_masked else 4):
                x = x - out[i][j] * (4.0 ** (k - i))
            if j < 3:
                for i in range(k):
                    x = x - out[i][j + 1] * (4.0 ** (k - i - 4))
            out[k][j] = x
    return out


#: (id(base tensor), tag) -> (weakref to it, key of the view, operand); see _cached
_OPERANDS: dict = {}


def mma_operand(rot, transpose: bool):
    """A ``[H, D, D]`` rotation (float) as the decode kernel's fp16 tensor-core operand:
    ``A = rot[h]^T`` (``transpose``: the query rotation, ``q'^T = R_K^T q^T``) or
    ``A = rot[h]`` (the output rotation, ``o^T = R_V o'^T``) in ``mma.m16n8k16``
    A-fragment order, as int32 ``[H', D * D / 2]`` (``H' = 1`` when every head shares one
    matrix, i.e. ``H == 1`` or a stride-0 expand), plus the head stride in int32 words (0
    when shared).

    Element ``[h, ((mt * D/16 + ks) * 32 + lane) * 4 + r]`` holds the fp16 pair
    ``(A[m, k], A[m, k + 1])`` with ``m = 16 mt + lane // 4 + 8 (r % 2)`` and
    ``k = 16 ks + 2 (lane % 4) + 8 (r // 2)``. fp16 keeps 11 bits of the orthogonal
    matrix's entries (``|R| <= 1``), below the bf16 rounding of ``q'`` that follows and the
    kernel's bf16-level tolerance on ``o``.

    Cached per source tensor (weakly, keyed by its base tensor, the view's geometry and the
    version counter, so an in-place update or a new tensor is never served stale data); not
    cached while a CUDA graph is being captured (the conversion then runs inside the graph).
    """
    import torch

    def make():
        n, d, _ = rot.shape
        shared = n == 1 or rot.stride(0) == 0
        a = rot[:1] if shared else rot
        a = (a.transpose(-1, -2) if transpose else a).to(torch.float16)          # [H', m, k]
        mt = d // 16
        # (H, MT, RM, G, KS, RK, Q4, P) -> (H, MT, KS, G, Q4, RK, RM, P): m = 16 MT + 8 RM
        # + G, k = 16 KS + 8 RK + 2 Q4 + P, lane = 4 G + Q4, register r = RM + 2 RK
        frag = a.reshape(-1, mt, 2, 8, mt, 2, 4, 2).permute(0, 1, 4, 3, 6, 5, 2, 7)
        frag = frag.contiguous().view(-1, d * d).view(torch.int32)
        return frag, 0 if shared else d * d // 2
    return _cached(rot, "kT" if transpose else "v", make)


def _cached(rot, tag: str, make):
    """``make()`` for the rotation tensor ``rot``, cached per source tensor (weakly, keyed
    by its base tensor, the view's geometry and the version counter); not stored while a
    CUDA graph is being captured (the conversion then runs inside the graph)."""
    import torch

    base = rot._base if rot._base is not None else rot
    key = (rot.data_ptr(), tuple(rot.shape), tuple(rot.stride()), rot._version, tag)
    with _COUNTERS_LOCK:
        hit = _OPERANDS.get((id(base), tag))
        if hit is not None and hit[0]() is base and hit[1] == key:
            return hit[2]
    result = make()
    if not (rot.is_cuda and torch.cuda.is_current_stream_capturing()):
        with _COUNTERS_LOCK:
            if len(_OPERANDS) >= 256:      # forget the entries of freed tensors
                for k in [k for k, v in _OPERANDS.items() if v[0]() is None]:
                    del _OPERANDS[k]
            _OPERANDS[(id(base), tag)] = (weakref.ref(base), key, result)
    return result


_COUNTERS: dict = {}
_COUNTERS_LOCK = threading.Lock()
#: device index -> zeroed ticket buffers kept for streams first seen while a CUDA graph is
#: being captured on them (so the graph does not get a memset node of its own buffer)
_SPARES: dict = {}
#: replaced ticket buffers: a captured graph keeps their addresses, so they are never freed
_RETIRED: list = []
#: spare ticket buffers kept per device
SPARE_TICKET_BUFFERS = 2
#: int32 words per arena of zeroed tickets for calls captured into CUDA graphs (4 MB)
CAPTURE_ARENA_WORDS = 1 << 20
#: device index -> [zeroed int32 arena, next free word]; each captured call takes its own
#: slice, so no two graphs (nor a graph and eager calls) ever share tickets
_ARENAS: dict = {}


def _counters(dev, n: int):
    """Zeroed int32 tickets, one per (sequence, KV head), for the kernel's last-CTA merge.

    Every launch leaves them zero again (the last CTA resets its ticket). Eager calls: one
    buffer per (device, stream) serves every call on that stream; calls that may run
    concurrently must be on different streams. A call captured into a CUDA graph gets
    tickets of its own (:func:`_capture_tickets`), so graphs replayed concurrently on
    different streams, or next to eager calls on the stream they were captured on, never
    share them (a shared ticket would merge another call's partials, or leave a merge CTA
    waiting for counts that never come).

    A buffer that is replaced by a larger one is kept alive, since a graph may hold its
    address. (Debug trace builds, ``OSCAR_CUTE_TRACE``, keep one buffer per stream for
    captures too, where perf/trace_decode.py reads the stamps: a stream first seen while a
    graph is being captured takes a spare buffer zeroed ahead of time, since a
    ``torch.zeros`` there would put a memset node into the graph.)
    """
    import torch

    key = (dev.index if dev.index is not None else torch.cuda.current_device(),
           torch.cuda.current_stream(dev).cuda_stream)
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing and not os.environ.get("OSCAR_CUTE_TRACE"):
        return _capture_tickets(dev, key[0], n)
    with _COUNTERS_LOCK:
        if key[0] not in _ARENAS and not capturing:
            # zeroed ahead of the first capture (a torch.zeros while capturing would put a
            # memset node into that graph)
            _ARENAS[key[0]] = [torch.zeros(CAPTURE_ARENA_WORDS, dtype=torch.int32,
                                           device=dev), 0]
        buf = _COUNTERS.get(key)
        if buf is None or buf.numel() < n:
            size = max(n, 4096)
            if os.environ.get("OSCAR_CUTE_TRACE"):   # debug trace builds: 128 B per CTA
                size = TRACE_OFFSET // 4 + (1 << 22)
            spares = _SPARES.setdefault(key[0], [])
            fit = [t for t in spares if t.numel() >= size]
            if capturing and fit:
                new = fit[0]
                spares.remove(new)
            else:
                new = torch.zeros(size, dtype=torch.int32, device=dev)
                if not capturing:
                    spares[:] = [t for t in spares if t.numel() >= size]
                    spares.extend(torch.zeros(size, dtype=torch.int32, device=dev)
                                  for _ in range(SPARE_TICKET_BUFFERS - len(spares)))
            if buf is not None:
                _RETIRED.append(buf)
            buf = _COUNTERS[key] = new
    return buf


def _capture_tickets(dev, index: int, n: int):
    """A zeroed slice of ``n`` tickets (128-byte aligned) for one call being captured into a
    CUDA graph, never handed out again: the arena of device ``index`` zeroed ahead of time
    by the first eager call (:func:`_counters`), or a new one zeroed here when it is used
    up or missing (a memset node in the graph being captured; the old arena is kept alive,
    graphs hold its addresses)."""
    import torch

    need = -(-max(n, 1) // 32) * 32
    with _COUNTERS_LOCK:
        arena = _ARENAS.get(index)
        if arena is None or arena[1] + need > arena[0].numel():
            if arena is not None:
                _RETIRED.append(arena[0])
            arena = _ARENAS[index] = [torch.zeros(max(CAPTURE_ARENA_WORDS, need),
                                                  dtype=torch.int32, device=dev), 0]
        start = arena[1]
        arena[1] = start + need
        return arena[0][start:start + n]


def append(*_args, **_kwargs):
    raise UnsupportedConfigError("the CuTe backend does not implement append (use triton)")


def extend(*_args, **_kwargs):
    raise UnsupportedConfigError("the CuTe backend does not implement extend (use triton)")
