"""The plan rules (:mod:`oscar_kernels.cute.plan`): split counts, CTA width, length hint,
merge-CTA and 4-deep ring builds, the build a call launches."""

from __future__ import annotations

import math

import pytest
import torch

from oscar_kernels.cute import bundle, config, plan


@pytest.mark.parametrize("batch_size,num_kv_heads,group,want", [
    (1, 8, 4, 49),     # one wave, merge kernel anyway: 3 CTAs per SM (396 // 8)
    (1, 1, 8, 128), (128, 8, 4, 1), (8, 8, 4, 8), (128, 1, 8, 4),
    (2, 8, 4, 33),     # 33 * 4 > 128: merge kernel; 3 per SM (24 * 4 = 96) would be the
                       # fused tail, so 4 per SM; never rounded down to 32 (128-row tail)
    (32, 1, 8, 16),    # 16 * 8 = FUSED_TAIL_ROWS: the kernel merges itself
    (16, 1, 8, 24),    # 33 fit in one wave but go through the merge kernel: 3 per SM
    (8, 1, 8, 49),
    (50, 8, 4, 6),     # 1 split fills only 400 of 528 slots: about 4 waves of 6 splits
    (100, 8, 4, 3),    # 800 CTAs are 1.5 waves: 3 splits
    (64, 8, 4, 1)])    # 512 of 528 slots: one wave
def test_num_splits_depends_on_shapes_only(batch_size, num_kv_heads, group, want):
    got = plan.num_splits_for(batch_size, num_kv_heads, 132, group)
    assert got == want
    assert 1 <= got <= config.MAX_SPLITS


@pytest.mark.parametrize("batch_size,num_kv_heads,group,head_dim,want", [
    (8, 8, 4, 128, (8, 4)),      # one wave of 256 wide CTAs, 16 partial rows
    (2, 8, 4, 128, (8, 16)),     # 64 rows: still two round trips of the fused tail
    (32, 8, 4, 128, (8, 1)),
    (32, 1, 8, 128, (8, 8)),     # 8 x 8 = 64 rows
    (256, 1, 8, 128, (8, 1)),
    (1, 8, 4, 128, (8, 16)),     # wide: 33 splits x 4 = 132 rows; 16 splits: 128 CTAs, 64 rows
    (1, 4, 4, 128, (4, 99)),     # 16 capped splits would leave 64 CTAs: 4 warps, merge kernel
    (2, 4, 4, 128, (8, 16)),
    (8, 1, 8, 128, (4, 33)),     # the 4-deep ring decode build: 2 CTAs per SM, merge kernel
    (4, 1, 8, 128, (4, 66)),
    (16, 1, 8, 128, (4, 24)),    # wide: 16 x 8 = 128 rows in four round trips -> 4 warps;
                                 # 16 splits (2 per SM) would be a 128-row fused tail: 3 per SM
    (64, 8, 4, 128, (4, 1)),     # wide: 512 CTAs are two waves -> 4 warps
    (128, 8, 4, 128, (4, 1)),
    (50, 8, 4, 128, (4, 6)),
    (8, 8, 4, 64, (4, 8)),       # head_dim 64: 4 warps only
    (26, 1, 8, 128, (8, 10)),    # GQA 8: up to WIDE_MAX_ROWS_DECODE (80) rows
    (29, 1, 8, 128, (8, 9)),
    (24, 1, 8, 128, (4, 22)),    # 11 x 8 = 88 rows: 4 warps
    (89, 1, 8, 128, (4, 4)),     # 445 CTAs: 4 on 49 SMs; 356: at most 3 (busiest_sm_splits)
    (100, 1, 8, 128, (4, 5)),    # 500 CTAs; 400 would also put 4 on some SMs
    (12, 8, 4, 128, (4, 4)),
    (7, 8, 4, 128, (4, 9)),      # 504 CTAs, 4 on some SMs: 4/9 of a sequence; wide 8 x 4: 2/4
    (9, 8, 4, 128, (4, 7)),      # 4/7 against 8 x 3's 2/3 (WIDE_BUSY_MARGIN)
    (9, 8, 1, 128, (4, 7)),      # MHA: the same pair kernel
    (6, 8, 4, 128, (8, 5)),      # 4 x 11: 4/11 against 2/5, 9 % less: stays wide
    (72, 1, 8, 128, (8, 3))])    # GQA 8 (decode) stays wide at 14 % less
def test_plan_picks_the_wide_build_for_one_wave_and_a_short_tail(batch_size, num_kv_heads, group,
                                                            head_dim, want):
    assert plan.plan(batch_size, num_kv_heads, 132, group, head_dim) == want
    # without the wide kernels (an older bundle) every shape runs 4 warps
    assert plan.plan(batch_size, num_kv_heads, 132, group, head_dim, False) == (
        4, plan.num_splits_for(batch_size, num_kv_heads, 132, group, head_dim=head_dim))


def test_busiest_sm_splits_lowers_the_busiest_sms_load():
    """A single wave of 4-warp CTAs: the chosen split count never loads the busiest SM more
    than the planned one, takes fewer splits only for a gain of BUSY_MIN_GAIN or more, and
    no count in [s // 2, s] would have been lighter still."""
    def load(rows, s, nsm):
        return math.ceil(rows * s / nsm) / s

    for nsm in (132, 114, 78):
        for rows in range(1, 4 * nsm + 1):
            for s in range(1, 4 * nsm // rows + 1):
                got = plan.busiest_sm_splits(rows, s, nsm)
                assert max(1, s // 2) <= got <= s
                best = min(load(rows, x, nsm) for x in range(max(1, s // 2), s + 1))
                if got != s:
                    assert load(rows, got, nsm) == best
                    assert best <= (1 - plan.BUSY_MIN_GAIN) * load(rows, s, nsm)
                else:
                    assert best > (1 - plan.BUSY_MIN_GAIN) * load(rows, s, nsm)


def test_plan_keeps_4_warps_only_for_a_lighter_busiest_sm():
    """Where both widths plan a single wave with the fused tail, the pair kernel (GQA <= 4)
    runs 4 warps exactly when that loads the busiest SM more than WIDE_BUSY_MARGIN less."""
    seen = set()
    for nsm in (132, 114, 78):
        for h in (1, 2, 4, 8, 16):
            for group in (1, 2, 4, 8):
                for b in range(1, 257):
                    rows = b * h
                    narrow = plan.num_splits_for(b, h, nsm, group, head_dim=128)
                    wide = plan.num_splits_for(b, h, nsm, group, warps=8)
                    max_rows = (plan.WIDE_MAX_ROWS if group <= config.PAIR_MAX_GROUP
                                else plan.WIDE_MAX_ROWS_DECODE)
                    if not (rows * wide <= 2 * nsm and wide * group <= max_rows
                            and rows * narrow <= 4 * nsm
                            and narrow * group <= config.FUSED_TAIL_ROWS):
                        continue
                    lighter = (plan.busiest_sm_load(rows, narrow, nsm)
                               < (1 - plan.WIDE_BUSY_MARGIN) * plan.busiest_sm_load(rows, wide, nsm)
                               - 1e-9)
                    want = (4, narrow) if lighter and group <= config.PAIR_MAX_GROUP else (8, wide)
                    assert plan.plan(b, h, nsm, group, 128) == want, (nsm, h, group, b)
                    seen.add(want[0])
    assert seen == {4, 8}


@pytest.mark.parametrize("batch_size,max_kv_len,want", [
    (7, None, (4, 9)), (7, 8192, (8, 4)), (7, 16384, (8, 4)), (7, 16385, (4, 9)),
    (7, 2048, (8, 2)),           # short_splits: one wide CTA per SM
    (9, 8192, (8, 3)), (9, 12288, (8, 3)), (9, 12289, (4, 7)), (9, 131072, (4, 7))])
def test_length_hint_keeps_the_wide_plan_for_short_sequences(batch_size, max_kv_len, want):
    """qwen3-8b shapes: the lighter 4-warp wave (WIDE_BUSY_MARGIN) only when a wide warp's
    share of the longest sequence exceeds WIDE_SHORT_WARP_TOKENS; no hint plans from the
    shapes."""
    assert plan.plan(batch_size, 8, 132, 4, 128, max_kv_len=max_kv_len) == want


@pytest.mark.parametrize("batch_size,want,want_before", [
    (1, 128, 128), (2, 128, 128), (4, 66, 99), (8, 33, 49), (12, 22, 33), (16, 24, 24)])
def test_ring4_decode_waves_leave_two_slots_per_sm(batch_size, want, want_before):
    """GQA > 4 at head_dim 128 with 4 warps (the 4-deep ring decode build): a single wave
    whose partials go to the merge kernel is planned for two CTAs per SM fewer (one fewer if
    that would land on the fused tail); other head dims and GQA classes keep one fewer."""
    assert plan.num_splits_for(batch_size, 1, 132, 8, head_dim=128) == want
    assert plan.num_splits_for(batch_size, 1, 132, 8, head_dim=64) == want_before
    assert plan.num_splits_for(batch_size, 1, 132, 8) == want_before
    assert plan.num_splits_for(batch_size, 1, 132, 8, 8, 128) == plan.num_splits_for(
        batch_size, 1, 132, 8, 8)


def test_merge_cta_plan():
    """The merge-CTA build runs wide pair calls (GQA <= 4) with MERGE_CTA_MIN_SPLITS+ splits
    merged in the fused tail when the split CTAs plus one merge CTA per (sequence, KV head)
    fit one wave of 2 CTAs per SM: qwen3-8b (8 KV heads) batch 1 at the plan's 16 splits."""
    assert plan.plan(1, 8, 132, 4, 128, True) == (8, 16)
    assert plan.use_merge_ctas(8, 16, 132, 4)
    assert not plan.use_merge_ctas(16, 8, 132, 4)        # batch 2: 8 splits
    assert not plan.use_merge_ctas(8, 16, 60, 4)         # 136 CTAs > 2 per SM x 60 SMs
    assert not plan.use_merge_ctas(8, 16, 132, 8)        # GQA 8: the decode build
    assert not plan.use_merge_ctas(1, 40, 132, 4)        # 160 rows: the merge kernel
    assert not plan.use_merge_ctas(8, 1, 132, 4)         # one split: nothing to merge


def test_launch_op_names_the_build_a_call_runs():
    """``launch_op`` (what ``decode_steps`` launches, and ``perf/trace_decode.py`` reads): the
    op per GQA class and page size, the merge-CTA and 4-deep ring builds by the plan's rule or
    forced, typed errors; no device query unless the merge-CTA choice (GQA <= 4, 8 warps, 2+
    splits) or the 4-warp ring-4 choice is the plan's."""
    from oscar_kernels.errors import UnsupportedConfigError

    dev = torch.device("cuda", 0)    # never queried below
    assert plan.launch_op(1, 1, 8, 128, 8, 4, dev) == "decode"
    assert plan.launch_op(1, 1, 4, 128, 4, 40, dev, ring4=False) == "decode_pair"
    assert plan.launch_op(1, 1, 4, 128, 8, 1, dev, ring4=False) == "decode_pair"
    assert plan.launch_op(1, 1, 3, 64, 4, 3, dev, any_page=True) == "decode_pair_anypage"
    assert plan.launch_op(1, 1, 3, 64, 4, 3, dev) == "decode_pair"      # no ring-4 build at 64
    assert plan.launch_op(1, 8, 4, 128, 8, 16, dev, merge_ctas=False, ring4=False) == "decode_pair"
    if bundle.has_kernel("decode_pair_mc", 128, 8):
        assert plan.launch_op(1, 8, 4, 128, 8, 16, dev, merge_ctas=True) == "decode_pair_mc"
    if bundle.has_kernel("decode_pair_ring4", 128, 8):
        # the wide plans of qwen3-8b batch 2 (16 splits) and 4 (8) take the 4-deep ring,
        # batch 8 (4 splits) not; forced either way
        assert plan.launch_op(2, 8, 4, 128, 8, 16, dev, merge_ctas=False) == "decode_pair_ring4"
        assert plan.launch_op(4, 8, 4, 128, 8, 8, dev, merge_ctas=False) == "decode_pair_ring4"
        assert plan.launch_op(8, 8, 4, 128, 8, 4, dev, merge_ctas=False) == "decode_pair"
        assert plan.launch_op(32, 8, 4, 128, 8, 1, dev) == "decode_pair_ring4"   # one split
        kw = {"merge_ctas": False}
        assert plan.launch_op(8, 8, 4, 128, 8, 4, dev, ring4=True, **kw) == "decode_pair_ring4"
        assert plan.launch_op(4, 8, 4, 128, 8, 8, dev, ring4=False, **kw) == "decode_pair"
        assert plan.launch_op(1, 8, 4, 128, 4, 3, dev, ring4=True) == "decode_pair_ring4"
    with pytest.raises(UnsupportedConfigError, match="num_splits: the 8-warp build merges"):
        plan.launch_op(1, 1, 8, 128, 8, 17, dev)
    with pytest.raises(UnsupportedConfigError, match="merge_ctas: the merge-CTA build"):
        plan.launch_op(1, 1, 8, 128, 8, 4, dev, merge_ctas=True)
    for args in ((1, 1, 8, 128, 4, 4), (1, 1, 4, 64, 4, 4), (1, 1, 4, 128, 4, 4, dev, True)):
        with pytest.raises(UnsupportedConfigError, match="ring4: the 4-deep ring build"):
            plan.launch_op(*args[:6], dev, *args[7:], ring4=True)


def test_use_ring4_follows_the_measured_shapes():
    """The 4-deep ring pair build: wide calls from RING4_MIN_SPLITS splits (qwen3-8b batch
    2-6) or with one split (batch 27-33), not with 2-4 (batch 7-16), 4-warp calls whose grid
    is one wave (qwen3-8b batch 64 on 132 SMs: 512 CTAs; not batch 128)."""
    assert plan.use_ring4(16, 16, 0, 8) and plan.use_ring4(32, 8, 0, 8)
    assert plan.use_ring4(40, 6, 0, 8) and plan.use_ring4(256, 1, 0, 8)
    assert not plan.use_ring4(64, 4, 0, 8) and not plan.use_ring4(128, 2, 0, 8)
    assert plan.use_ring4(512, 1, 132, 4) and not plan.use_ring4(1024, 1, 132, 4)
    for b, want in ((2, True), (4, True), (5, True), (6, True), (8, False), (16, False),
                    (32, True)):
        warps, splits = plan.plan(b, 8, 132, 4, 128)
        assert warps == 8 and plan.use_ring4(b * 8, splits, 132, warps) == want, b


@pytest.mark.parametrize("batch_size,num_kv_heads,group,head_dim,max_kv_len,want", [
    (2, 8, 4, 128, 8192, (8, 8)),       # qwen3-8b: 256 wide CTAs -> one per SM
    (2, 8, 4, 128, 16384, (8, 8)),      # a warp's share 128 tokens < 192
    (2, 8, 4, 128, 32768, (8, 16)),     # 256 tokens: as planned from the shapes
    (3, 8, 4, 128, 4096, (8, 5)),
    (4, 8, 4, 128, 16384, (8, 8)),      # 256 tokens
    (10, 8, 4, 128, 2048, (8, 3)),      # one per SM would leave 52 of 132 SMs empty
    (12, 8, 4, 128, 2048, (4, 4)),      # 384 4-warp CTAs: more than two per SM
    (4, 1, 8, 128, 16384, (4, 33)),     # llama3-70b-tp8, merge kernel either way
    (4, 1, 8, 128, 32768, (4, 66)),     # a 4-warp share of 124 tokens >= 120
    (8, 1, 8, 128, 2048, (4, 33)),      # 16 splits would land on the 128-row fused tail
    (32, 1, 8, 128, 8192, (8, 4)),
    (32, 1, 8, 128, 16384, (8, 8)),
    (48, 1, 8, 128, 4096, (8, 2)),      # 96 CTAs: 73 % of the SMs
    (8, 3, 3, 64, 2048, (4, 22)),       # smollm2: four 4-warp CTAs per SM, kept
    (1, 8, 4, 128, 2048, (8, 16)),      # 128 CTAs: one per SM already
])
def test_length_hint_plans_one_cta_per_sm_for_short_single_waves(
        batch_size, num_kv_heads, group, head_dim, max_kv_len, want):
    shapes = plan.plan(batch_size, num_kv_heads, 132, group, head_dim)
    assert plan.plan(batch_size, num_kv_heads, 132, group, head_dim, True, None) == shapes
    assert plan.plan(batch_size, num_kv_heads, 132, group, head_dim, True, max_kv_len) == want


def test_length_hint_plans_stay_launchable():
    """Over every batch 1-256 and length of the three presets, the hint only lowers the split
    count of the shapes' plan (or, for short sequences, of the wide plan the shapes traded
    for a lighter 4-warp wave), keeps the merge path, and never plans a wide call whose
    partials would need the merge kernel."""
    for h, group, d in ((8, 4, 128), (1, 8, 128), (3, 3, 64)):
        for b in range(1, 257):
            w0, s0 = plan.plan(b, h, 132, group, d)
            for n in (0, 1, 300, 2048, 4096, 12000, 16384, 50000, 131072, 1 << 20):
                w, s = plan.plan(b, h, 132, group, d, True, n)
                top = s0
                if w != w0:
                    assert (w0, w) == (4, 8) and group <= config.PAIR_MAX_GROUP, (h, b, n)
                    top = plan.num_splits_for(b, h, 132, group, warps=8)
                assert 1 <= s <= top, (h, b, n)
                assert (s * group > config.FUSED_TAIL_ROWS) == (top * group > config.FUSED_TAIL_ROWS)
                assert w == 4 or s * group <= config.FUSED_TAIL_ROWS
                if s < top:
                    assert b * h * s <= 132 < b * h * top


def test_length_hint_takes_the_4_deep_ring_for_short_pair_calls():
    """A warp's share of at most RING4_WARP_TOKENS tokens: qwen3-8b batch 8 (4 wide splits)
    up to 32K, batch 16 (2 splits) up to 16K, batch 24 (4 warps x 11 splits, four waves) up
    to 22K; the shape rule's choices stay (the hint only adds the shallow ring)."""
    assert plan.use_ring4(64, 4, 0, 8, 32768) and not plan.use_ring4(64, 4, 0, 8, 32769)
    assert plan.use_ring4(128, 2, 0, 8, 16384) and not plan.use_ring4(128, 2, 0, 8, 65536)
    assert plan.use_ring4(192, 11, 132, 4, 16384) and not plan.use_ring4(192, 11, 132, 4, 32768)
    assert plan.use_ring4(40, 6, 0, 8, 1 << 20) and plan.use_ring4(256, 1, 0, 8, 1 << 20)
    assert not plan.use_ring4(64, 4, 0, 8, None)
    if bundle.has_kernel("decode_pair_ring4", 128, 8):
        dev, kw = torch.device("cuda", 0), {"merge_ctas": False}   # device never queried
        assert plan.launch_op(8, 8, 4, 128, 8, 4, dev, max_kv_len=8192,
                              **kw) == "decode_pair_ring4"
        assert plan.launch_op(8, 8, 4, 128, 8, 4, dev, max_kv_len=65536, **kw) == "decode_pair"
