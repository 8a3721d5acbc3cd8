"""The decode plan: which build runs a call and over how many splits.

Each rule is one function, decided from the shapes (``batch_size``, ``num_kv_heads``, GQA
ratio, ``head_dim``, the SM count) and, where the caller gives it, the length hint
``max_kv_len``; never from the lengths on the device, so every plan is graph-capturable
(any plan is correct for any length: another plan sums the splits in another order). The
numbers behind each rule were measured on an H200 in alternating rounds with
``perf/bench_decode.py`` / ``perf/ab.sh`` (plans forced through the ``warps`` /
``num_splits`` / ``merge_ctas`` / ``ring4`` arguments of
:func:`oscar_kernels.cute.launch.decode`) and ``perf/split_sweep_graph.py``.

* :func:`num_splits_for`: splits for a CTA width (one full wave, or about four waves);
* :func:`busiest_sm_splits`: fewer splits when that lightens the busiest SM;
* :func:`plan`: 4 or 8 warps per CTA, and the split count;
* :func:`short_splits`: one CTA per SM for short sequences (length hint);
* :func:`use_merge_ctas`: the merge-CTA build;
* :func:`use_ring4`: the pair kernel's 4-deep ring build;
* :func:`launch_op`: the build a planned call launches.
"""

from __future__ import annotations

import math

from ..errors import UnsupportedConfigError
from . import bundle
from .config import (CHUNK, FUSED_TAIL_ROWS, MAX_SPLITS, PAIR_MAX_GROUP, SHALLOW_STAGES,
                     SM_WARPS, ring_depth)

#: Least fill of the single wave the split heuristic accepts before adding a split.
WAVE_FILL = 0.8
#: A single wave of 4-warp CTAs takes fewer splits when that lowers the busiest SM's load by
#: at least this fraction (see :func:`busiest_sm_splits`).
BUSY_MIN_GAIN = 0.05
#: ... and the pair kernel's single wave of 4-warp CTAs (fused tail) is planned instead of
#: the wide build's single wave when its busiest SM holds more than this fraction less of a
#: sequence (see :func:`busiest_sm_load` and :func:`plan`).
WIDE_BUSY_MARGIN = 0.10
#: The wide build (8 warps per CTA) is planned only where its fused tail merges at most this
#: many partial rows per (sequence, KV head): two 32-row round trips (see :func:`plan`).
WIDE_MAX_ROWS = 64
#: ... and, for ``decode`` (GQA > 4), up to this many: 2.5 round trips still beat 4-warp CTAs
#: there (alternating rounds):
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
#: also with one split): with the ring-4 builds' unmasked K operands 5-6 splits (qwen3-8b
#: batch 5-6) and one split (batch 27-33) are faster with it than with 8 stages.
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
    llama3-70b-tp8 batch 8 at 64K/128K 0.8-1.8 us faster; ``perf/split_sweep_graph.py``).

    ``decode`` (GQA > 4) at ``head_dim`` 128 with 4 warps has a 4-deep ring
    and such a wave is planned for two CTAs per SM fewer, when its partials still go to the
    merge kernel (else one fewer, as before): llama3-70b-tp8 batch 4 66 vs 99 splits 0.4-1.9
    us faster at 8K-128K, batch 8 33 vs 49 splits 0.6-1 us at 8K-64K and even at 128K, batch
    12 22 vs 33 splits 0.9-1.6 us faster at 8K-32K, even at 64K, 0.9 us slower at 128K;
    batch 16 keeps 24 (16 splits land on a 128-row fused tail: 8-11 us slower);
    ``perf/split_sweep_graph.py``.

    No rounding down to the fused tail's limit: that always lands on a 128-row tail, which
    is slower than the merge kernel (qwen3-8b batch 2: 32 splits with the fused tail 39.5 /
    72.5 us at 32K / 128K, 33 splits and the merge kernel 33.2 / 65.0 us).

    A single wave of 4-warp CTAs with the fused tail takes fewer splits
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
    (alternating rounds): 4 splits
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
    sequences where the shapes alone pick a lighter 4-warp wave.
    Graph-capturable either way (a captured launch keeps its plan; any plan is correct for
    any length).

    The wide build (8 warps per CTA, 2 CTAs per SM, head_dim 128) runs when its own plan is
    a single wave whose partials the fused tail merges in at most ``WIDE_MAX_ROWS`` rows
    per (sequence, KV head) (``WIDE_MAX_ROWS_DECODE`` for GQA > 4);
    otherwise CTAs of 4 warps. Half as many CTAs per SM then share
    an SM's issue slots, and the per-CTA work of a single wave (query rotation, combine,
    partial stores; all at the same moment on every SM) halves per SM. Measured on an H200
    (``perf/cute_bench.py --warps 4|8``, alternating rounds), 8 vs 4 warps:

    * faster: qwen3-8b batch 2-32 (2-9 %, e.g. batch 8 / 64K 99 -> 95 us), llama3-70b-tp8
      batch 32-256 (4-18 %);
    * slower, so not taken: qwen3-8b batch 1 and llama3-70b-tp8 batch 8-16 (the wide plan's
      132-264 rows, or 128 rows in four fused round trips, against the merge kernel:
      +2-9 %), and several waves of wide CTAs (qwen3-8b batch 50 / 100 +2-7 %, batch 64 / 128
      at 8K +3-8 %; batch 64 / 128 at 100K 3-5 % faster, but the plan cannot see lengths);
    * head_dim 64 keeps 4 warps (its 4 M tiles of the rotations cannot feed 8 warps).

    The pair kernel (GQA <= 4) keeps its 4-warp plan when that is a single
    wave with the fused tail whose busiest SM holds more than ``WIDE_BUSY_MARGIN`` less of a
    sequence than the wide plan's (:func:`busiest_sm_load`; the wide build halves the
    per-CTA work, which the load does not count). Measured on an H200 (alternating rounds),
    4 against 8 warps: qwen3-8b batch 9 (4 x 7 against
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

    Where the wide plan would need more than ``WIDE_MAX_ROWS`` rows, ``decode_pair``
    (GQA <= 4) takes ``WIDE_MAX_ROWS // group`` splits instead, fused tail and no merge kernel,
    when that still makes ``CAPPED_MIN_FILL`` x #SMs CTAs or more: qwen3-8b batch 1 (128 CTAs
    of 16 splits) 5-8.5 % faster at 8K-64K and 1 % at 128K than 4 warps x 49 splits and the
    merge kernel (``perf/split_sweep_graph.py``). ``decode`` (GQA 8) keeps
    4 warps: llama3-70b-tp8 batch 16 with 8 wide splits was 9 % faster at 8K but 3 % slower at
    128K, batch 12 (96 CTAs) up to 22 % slower.
    """
    rows = batch_size * num_kv_heads
    hint = max_kv_len
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
        # more than WIDE_BUSY_MARGIN less than the wide single wave (strictly:
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

    Measured on an H200 (alternating rounds, ``perf/ab.sh``):
    the one-CTA-per-SM plans against the shapes' ones, e.g. qwen3-8b batch 2 (8 against 16
    wide splits) 8-16 % faster at 2K-8K and 4 % at 16K, even from 32K (a warp's share 256
    tokens); batch 3 (5 / 11) 12-15 % at 2K-8K, even at 16K, slower at 32K; llama3-70b-tp8
    batch 2-7 (4 warps, 66 / 128 splits at batch 2) 5-12 % faster at 2K-16K, even or up to
    5 % slower from a warp's share of ~124 tokens (batch 3 / 64K 186: 5 % slower); batch 32
    (4 / 8 wide splits) 7-12 % faster at 2K-8K, even at 16K. Not taken: four 4-warp CTAs per
    SM (smollm2 batch 8-32, qwen3-8b batch 12: up to 40 % slower with one), a third of the
    SMs left empty (qwen3-8b batch 10: 80 CTAs, 3 % slower). Benchmarks that plan from the
    shapes alone pass ``max_kv_len=None``."""
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
    on an H200 (``perf/ab.sh``, 3 rounds): qwen3-8b
    batch 1 (16 splits) 1.1 / 0.5 / 0.4 / 0 us faster at 8K / 32K / 64K / 128K, batch 2-3
    (8 and 5 splits) 0.2-0.6 us slower, batch 4 within noise; hence batch 1's plan only.
    ``decode(merge_ctas=...)`` overrides the choice (tests, benchmarks)."""
    ok = (group <= PAIR_MAX_GROUP and 1 < num_splits and num_splits * group <= FUSED_TAIL_ROWS)
    return (ok and num_splits >= MERGE_CTA_MIN_SPLITS
            and rows * (num_splits + 1) <= (SM_WARPS // 8) * num_sms)


def use_ring4(rows: int, num_splits: int, num_sms: int, warps: int,
              max_kv_len: int | None = None) -> bool:
    """Whether a ``decode_pair`` call (GQA <= 4, head_dim 128, pages of multiples of CHUNK
    tokens) of ``rows`` (sequence, KV head) pairs runs ``decode_pair_ring4``, the pair kernel
    with a 4-deep cp.async ring instead of 8: with 8 warps from ``RING4_MIN_SPLITS`` splits
    or with one split, with 4 warps when the grid is one wave. The ring-4
    builds run the int8 QK on unmasked K operands and ``decode_pair_w8`` does not
    (``k_operand_form``); against it, in alternating rounds on an H200
    (``perf/ab.sh``): qwen3-8b batch 5 (6 wide
    splits) 2.1 / 1.6 / 0.9 us faster at 32K / 64K / 128K, batch 32 (one split) 2.4-2.9 %,
    batch 8 (4 splits) 0.4 / 1.6 us faster at 32K / 64K but 2 us (1.3 %) slower at 128K and
    batch 16 (2 splits) 1.5 us faster at 32K, 1.7 / 0.7 us slower at 64K / 128K, so those keep
    8 stages. Every build at 4 against 8 stages, with masked K operands (alternating
    rounds):

    * faster: qwen3-8b batch 2 (16 wide splits) 3.1-3.9 us per call (32K 26.2-26.5 vs
      29.0-30.1), batch 3 (11 splits) 1.8-4.3 us, batch 4 (8 splits) 0-2.2 us, batch 12-13
      (4 warps x 5 splits, one wave) 1.7-3.7 us at 8K-64K and 2.4-3 % at 128K, batch 64 (4
      warps, 512 CTAs in one wave) 2.5-3.5 % at 8K-128K;
    * slower, so 8 stages there: qwen3-8b batch 5-6 (6 / 5 wide splits) up to 1.8 / 5 us
      at 64K-128K though faster at 8K, batch 8-16
      (4 and 2 wide splits) 3-4 % at 128K, batch 128 (4 warps, two waves) 5 % at 128K
      though 1-3 % faster at 8K-64K; batch 32 (one wide split) within 1 %.

    The rule follows the batch shape (``num_sms`` is read for 4 warps only); with the length
    hint ``max_kv_len`` also short sequences take the 4-deep ring: when a warp's
    share of the longest sequence, ``max_kv_len / (warps * num_splits)``, is at most
    ``RING4_WARP_TOKENS[warps]`` (split plans forced,
    alternating rounds): qwen3-8b batch 8 (4 wide splits) 1.2-2.6 / 2.0 / 0.7 us faster at 8K
    / 16K / 32K, even at 48K, 0.2-0.8 / 1 / 3 us slower at 64K / 96K / 128K; batch 10 (3
    splits) 1.5 us faster at 8K-16K, even at 32K-48K; batch 16 (2 splits) 1.2-2.5 us faster
    at 4K-8K, even at 16K-32K, slower from 48K; batch 24 (4 warps x 11 splits, four waves)
    3.5 / 2 us faster at 8K / 16K, 2-5 us slower at 32K-64K; batch 48 (4 x 6) 4 us faster at
    8K, slower from 16K. The merge-CTA build, when it runs, has a 4-deep ring of its own.
    ``decode(ring4=...)`` overrides the rule (tests, benchmarks)."""
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
             and bundle.has_kernel("decode_pair_mc", head_dim, 8))
    if merge_ctas and not mc_ok:
        raise UnsupportedConfigError(
            "merge_ctas: the merge-CTA build runs GQA <= 4 with 8 warps, 2 or more splits "
            f"merged in the fused tail, from a bundle that has it; got GQA {group}, {warps} "
            f"warps, {num_splits} splits")
    if mc_ok and (use_merge_ctas(batch_size * h, num_splits, num_sms(device), group)
                  if merge_ctas is None else merge_ctas):
        return "decode_pair_mc"
    ring4_ok = op == "decode_pair" and bundle.has_kernel("decode_pair_ring4", head_dim, warps)
    if ring4 and not ring4_ok:
        raise UnsupportedConfigError(
            "ring4: the 4-deep ring build runs GQA <= 4 at head_dim 128 with pages of a "
            f"multiple of {CHUNK} tokens, from a bundle that has it; got GQA {group}, "
            f"head_dim {head_dim}, {warps} warps, any_page={any_page}")
    if ring4_ok and (use_ring4(batch_size * h, num_splits,
                               num_sms(device) if warps == 4 else 0, warps, max_kv_len)
                     if ring4 is None else ring4):
        op = "decode_pair_ring4"
    return op


def num_sms(device) -> int:
    """Streaming multiprocessors of ``device`` (a CUDA device)."""
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
    return not any_page and bundle.has_kernel(decode_op(group), head_dim, 8)


