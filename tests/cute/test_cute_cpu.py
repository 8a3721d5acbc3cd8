"""CuTe backend logic that runs without a GPU: bundle manifest/loader, can_implement errors,
auto fallback, split planning. The kernels themselves are tested in test_cute_gpu.py."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from oscar_kernels import CacheSpec, cute
from oscar_kernels.cute import _bundle
from oscar_kernels.errors import BackendUnavailableError, UnsupportedConfigError


def _cfg(**kw):
    spec = CacheSpec(**{"num_kv_heads": 8, "head_dim": 128, "page_size": 16, **kw})
    return {"device": torch.device("cpu"), "spec": spec, "num_qo_heads": 32,
            "dtype": torch.bfloat16}


@pytest.mark.parametrize("op", ["append", "extend"])
def test_only_decode_is_implemented(op):
    with pytest.raises(UnsupportedConfigError, match="decode only"):
        cute.can_implement(op, **_cfg())
    with pytest.raises(UnsupportedConfigError):
        getattr(cute, op)()


def test_cpu_device_is_unavailable():
    with pytest.raises(BackendUnavailableError, match="sm_90"):
        cute.can_implement("decode", **_cfg())


def test_prebuilt_manifest_lists_both_head_dims(monkeypatch):
    monkeypatch.delenv("OSCAR_CUTE_BUNDLE", raising=False)
    manifest = _bundle.read_manifest()
    kernels = manifest["kernels"]
    assert {k["head_dim"] for k in kernels.values()} == {64, 128}
    for entry in kernels.values():
        assert entry["arch"] == "sm_90a"
        import os
        assert os.path.getsize(os.path.join(_bundle.bundle_dir(), entry["library"])) < 2 << 20


def test_prebuilt_bundle_has_every_op_per_head_dim(monkeypatch):
    """decode (GQA > 4), decode_pair (GQA <= 4: two chunks per softmax pass), their any-page
    builds and merge, for both head dims, under the names the loader looks up; decode_pair,
    the any-page builds and the merge-CTA build have decode's C ABI."""
    monkeypatch.delenv("OSCAR_CUTE_BUNDLE", raising=False)
    kernels = _bundle.read_manifest()["kernels"]
    assert set(_bundle.OPS) == {"decode", "decode_pair", "merge", "decode_anypage",
                                "decode_pair_anypage", "decode_pair_mc", "decode_pair_ring4"}
    assert set(_bundle.CORE_OPS) == {"decode", "decode_pair", "merge"}
    d128_only = {"decode_pair_mc", "decode_pair_ring4"}
    for d in (64, 128):
        for op in set(_bundle.OPS) - d128_only:
            entry = kernels[_bundle.kernel_name(op, d)]
            assert (entry["op"], entry["head_dim"], entry["warps"]) == (op, d, 4)
    # the wide build (8 warps per CTA) of both decode ops, the merge-CTA build (wide pair)
    # and the 4-deep ring pair build (4 and 8 warps), head_dim 128 only
    for op in ("decode", "decode_pair", "decode_pair_mc", "decode_pair_ring4"):
        entry = kernels[_bundle.kernel_name(op, 128, 8)]
        assert (entry["op"], entry["head_dim"], entry["warps"]) == (op, 128, 8)
        assert _bundle.has_kernel(op, 128, 8) and not _bundle.has_kernel(op, 64, 8)
    entry = kernels[_bundle.kernel_name("decode_pair_ring4", 128)]
    assert (entry["op"], entry["head_dim"], entry["warps"]) == ("decode_pair_ring4", 128, 4)
    assert not _bundle.has_kernel("decode_pair_ring4", 64, 4)
    assert not _bundle.has_kernel("decode_pair_mc", 128, 4)
    assert len(kernels) == 2 * (len(_bundle.OPS) - 2) + 3 + 2
    assert cute.decode_op(4) == "decode_pair" and cute.decode_op(5) == "decode"
    assert cute.decode_op(4, True) == "decode_pair_anypage"
    assert cute.decode_op(8, True) == "decode_anypage"
    if _bundle.mode() == "bundle":
        assert cute.wide_available(4, 128) and cute.wide_available(8, 128)
        assert not cute.wide_available(4, 64)
    assert not cute.wide_available(4, 128, any_page=True)     # 4 warps only
    for op in ("decode_pair", "decode_anypage", "decode_pair_anypage", "decode_pair_mc",
               "decode_pair_ring4"):
        assert _bundle._ARGTYPES[op] == _bundle._ARGTYPES["decode"]
    assert cute.PAIR_MAX_GROUP == 4   # the pair kernel holds the heads in MMA columns 0-3


def test_build_options_list_exactly_the_bundled_builds(monkeypatch):
    """_bundle.build_options is the one list of builds (aot build, JIT mode, has_kernel's JIT
    answer): exactly the (op, head_dim, warps) of the shipped bundle, each under the name the
    loader looks up, with the ring depth and flags its op names."""
    monkeypatch.delenv("OSCAR_CUTE_BUNDLE", raising=False)
    kernels = _bundle.read_manifest()["kernels"]
    listed = {(op, d, w) for op in _bundle.OPS for d in (64, 128) for w in cute.CTA_WARPS
              if _bundle.build_options(op, d, w) is not None}
    assert listed == {(e["op"], e["head_dim"], e["warps"]) for e in kernels.values()}
    for op, d, w in listed:
        assert _bundle.kernel_name(op, d, w) in kernels
    assert _bundle.build_options("decode_pair_ring4", 128, 8) == {
        "head_dim": 128, "pair": True, "warps": 8, "any_page": False, "merge_ctas": False,
        "stages": 4}
    assert _bundle.build_options("decode_anypage", 64)["any_page"]
    assert _bundle.build_options("decode_pair_mc", 128, 8)["merge_ctas"]
    for bad in (("decode_pair_mc", 128, 4), ("decode_pair_ring4", 64, 4), ("decode", 64, 8),
                ("merge", 128, 8), ("decode_anypage", 128, 8), ("decode", 128, 16),
                ("prefill", 128, 4)):
        assert _bundle.build_options(*bad) is None
    monkeypatch.setattr(_bundle, "mode", lambda: "jit")
    for op in _bundle.OPS:
        for w in cute.CTA_WARPS:
            assert _bundle.has_kernel(op, 128, w) == ((op, 128, w) in listed)


def test_missing_or_bad_bundle_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CUTE_BUNDLE", str(tmp_path))
    monkeypatch.setenv("OSCAR_CUTE_MODE", "bundle")
    with pytest.raises(BackendUnavailableError, match="manifest.json missing"):
        _bundle.available_head_dims()
    (tmp_path / "manifest.json").write_text(json.dumps({"bundle_format": 99, "kernels": {}}))
    with pytest.raises(BackendUnavailableError, match="bundle_format"):
        _bundle.read_manifest()
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BackendUnavailableError, match="unreadable"):
        _bundle.read_manifest()
    # bundles of older kernel ABIs (format 1: float32 R_K / R_V; 2: un-rotated partials and
    # a merge kernel taking R_V) are refused by name
    for old in (1, 2):
        (tmp_path / "manifest.json").write_text(json.dumps({"bundle_format": old, "kernels": {}}))
        with pytest.raises(BackendUnavailableError, match=f"expected bundle_format 3, got {old}"):
            _bundle.read_manifest()
    (tmp_path / "manifest.json").write_text(json.dumps({"bundle_format": _bundle.BUNDLE_FORMAT, "kernels": {
        "int2_decode_sm90_d128": {"op": "decode", "head_dim": 128, "library": "libnone.so"}}}))
    with pytest.raises(BackendUnavailableError, match="no decode kernel"):
        _bundle.available_head_dims()


def test_manifest_is_read_again_only_when_it_changes(tmp_path, monkeypatch):
    """Every decode call asks which builds exist: the manifest is parsed once per version of
    the file (one stat per call), and has_kernel / available_head_dims follow a rewrite."""
    monkeypatch.setenv("OSCAR_CUTE_BUNDLE", str(tmp_path))
    monkeypatch.setenv("OSCAR_CUTE_MODE", "bundle")
    (tmp_path / "libx.so").write_bytes(b"")

    def write(kernels):
        (tmp_path / "manifest.json").write_text(json.dumps(
            {"bundle_format": _bundle.BUNDLE_FORMAT, "kernels": kernels}))

    name = _bundle.kernel_name("decode_pair_ring4", 128, 8)
    write({name: {"op": "decode_pair_ring4", "head_dim": 128, "warps": 8, "library": "libx.so"}})
    first = _bundle.read_manifest()
    assert _bundle.read_manifest() is first                       # cached
    assert _bundle.has_kernel("decode_pair_ring4", 128, 8)
    assert not _bundle.has_kernel("decode_pair_ring4", 128, 4)
    with pytest.raises(BackendUnavailableError, match="no decode kernel"):
        _bundle.available_head_dims()
    write({_bundle.kernel_name(op, 64): {"op": op, "head_dim": 64, "library": "libx.so"}
           for op in _bundle.CORE_OPS})                            # a rebuilt bundle
    assert _bundle.read_manifest() is not first
    assert not _bundle.has_kernel("decode_pair_ring4", 128, 8)
    assert _bundle.available_head_dims() == (64,)


def test_mode_can_be_forced(monkeypatch):
    monkeypatch.setenv("OSCAR_CUTE_MODE", "bundle")
    assert _bundle.mode() == "bundle"
    monkeypatch.setenv("OSCAR_CUTE_MODE", "jit")
    assert _bundle.mode() == "jit"


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
    got = cute.num_splits_for(batch_size, num_kv_heads, 132, group)
    assert got == want
    assert 1 <= got <= cute.MAX_SPLITS


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
    assert cute.plan(batch_size, num_kv_heads, 132, group, head_dim) == want
    # without the wide kernels (an older bundle) every shape runs 4 warps
    assert cute.plan(batch_size, num_kv_heads, 132, group, head_dim, False) == (
        4, cute.num_splits_for(batch_size, num_kv_heads, 132, group, head_dim=head_dim))


def test_busiest_sm_splits_lowers_the_busiest_sms_load():
    """A single wave of 4-warp CTAs: the chosen split count never loads the busiest SM more
    than the planned one, takes fewer splits only for a gain of BUSY_MIN_GAIN or more, and
    no count in [s // 2, s] would have been lighter still."""
    def load(rows, s, nsm):
        return math.ceil(rows * s / nsm) / s

    for nsm in (132, 114, 78):
        for rows in range(1, 4 * nsm + 1):
            for s in range(1, 4 * nsm // rows + 1):
                got = cute.busiest_sm_splits(rows, s, nsm)
                assert max(1, s // 2) <= got <= s
                best = min(load(rows, x, nsm) for x in range(max(1, s // 2), s + 1))
                if got != s:
                    assert load(rows, got, nsm) == best
                    assert best <= (1 - cute.BUSY_MIN_GAIN) * load(rows, s, nsm)
                else:
                    assert best > (1 - cute.BUSY_MIN_GAIN) * load(rows, s, nsm)


def test_plan_keeps_4_warps_only_for_a_lighter_busiest_sm():
    """Where both widths plan a single wave with the fused tail, the pair kernel (GQA <= 4)
    runs 4 warps exactly when that loads the busiest SM more than WIDE_BUSY_MARGIN less."""
    seen = set()
    for nsm in (132, 114, 78):
        for h in (1, 2, 4, 8, 16):
            for group in (1, 2, 4, 8):
                for b in range(1, 257):
                    rows = b * h
                    narrow = cute.num_splits_for(b, h, nsm, group, head_dim=128)
                    wide = cute.num_splits_for(b, h, nsm, group, warps=8)
                    max_rows = (cute.WIDE_MAX_ROWS if group <= cute.PAIR_MAX_GROUP
                                else cute.WIDE_MAX_ROWS_DECODE)
                    if not (rows * wide <= 2 * nsm and wide * group <= max_rows
                            and rows * narrow <= 4 * nsm
                            and narrow * group <= cute.FUSED_TAIL_ROWS):
                        continue
                    lighter = (cute.busiest_sm_load(rows, narrow, nsm)
                               < (1 - cute.WIDE_BUSY_MARGIN) * cute.busiest_sm_load(rows, wide, nsm)
                               - 1e-9)
                    want = (4, narrow) if lighter and group <= cute.PAIR_MAX_GROUP else (8, wide)
                    assert cute.plan(b, h, nsm, group, 128) == want, (nsm, h, group, b)
                    seen.add(want[0])
    assert seen == {4, 8}


@pytest.mark.parametrize("batch_size,max_kv_len,want", [
    (7, None, (4, 9)), (7, 8192, (8, 4)), (7, 16384, (8, 4)), (7, 16385, (4, 9)),
    (7, 2048, (8, 2)),           # short_splits: one wide CTA per SM, as before session 23
    (9, 8192, (8, 3)), (9, 12288, (8, 3)), (9, 12289, (4, 7)), (9, 131072, (4, 7))])
def test_length_hint_keeps_the_wide_plan_for_short_sequences(batch_size, max_kv_len, want,
                                                             monkeypatch):
    """qwen3-8b shapes: the lighter 4-warp wave (WIDE_BUSY_MARGIN) only when a wide warp's
    share of the longest sequence exceeds WIDE_SHORT_WARP_TOKENS; the hint switch off
    (OSCAR_CUTE_LENGTH_HINT=0) plans from the shapes."""
    monkeypatch.delenv("OSCAR_CUTE_LENGTH_HINT", raising=False)
    assert cute.plan(batch_size, 8, 132, 4, 128, max_kv_len=max_kv_len) == want
    monkeypatch.setenv("OSCAR_CUTE_LENGTH_HINT", "0")
    assert cute.plan(batch_size, 8, 132, 4, 128, max_kv_len=max_kv_len) == (
        cute.plan(batch_size, 8, 132, 4, 128))


@pytest.mark.parametrize("batch_size,want,want_before", [
    (1, 128, 128), (2, 128, 128), (4, 66, 99), (8, 33, 49), (12, 22, 33), (16, 24, 24)])
def test_ring4_decode_waves_leave_two_slots_per_sm(batch_size, want, want_before):
    """GQA > 4 at head_dim 128 with 4 warps (the 4-deep ring decode build): a single wave
    whose partials go to the merge kernel is planned for two CTAs per SM fewer (one fewer if
    that would land on the fused tail); other head dims and GQA classes keep one fewer."""
    assert cute.num_splits_for(batch_size, 1, 132, 8, head_dim=128) == want
    assert cute.num_splits_for(batch_size, 1, 132, 8, head_dim=64) == want_before
    assert cute.num_splits_for(batch_size, 1, 132, 8) == want_before
    assert cute.num_splits_for(batch_size, 1, 132, 8, 8, 128) == cute.num_splits_for(
        batch_size, 1, 132, 8, 8)


def test_auto_falls_back_from_cute_on_cpu(caplog):
    from oscar_kernels.ops import _dispatch

    with caplog.at_level(logging.WARNING):
        name, _ = _dispatch("decode", "auto", torch.device("cpu"), {
            "spec": CacheSpec(num_kv_heads=2, head_dim=64, page_size=16), "num_qo_heads": 4,
            "dtype": torch.float32})
    assert name == "reference"
    with pytest.raises(BackendUnavailableError):
        _dispatch("decode", "cute", torch.device("cpu"), {
            "spec": CacheSpec(num_kv_heads=2, head_dim=64, page_size=16), "num_qo_heads": 4,
            "dtype": torch.float32})


@pytest.mark.parametrize("kw,num_qo_heads,match", [
    ({"head_dim": 32}, 32, "head_dim"),
    ({"group_size": 32}, 32, "group_size"),
    ({"scale_dtype": torch.float32}, 32, "scale_dtype"),
    ({}, 128, "GQA ratio"),
])
def test_unsupported_configs_are_typed(kw, num_qo_heads, match):
    cfg = _cfg(**kw)
    cfg["num_qo_heads"] = num_qo_heads
    with pytest.raises(UnsupportedConfigError, match=match):
        cute.can_implement("decode", **cfg)


@pytest.mark.parametrize("page_size,num_pages,ok", [
    (1, 1 << 24, True), (1, (1 << 24) + 1, False), (24, (1 << 24) // 24, True),
    (24, (1 << 24) // 24 + 1, False), (16, (1 << 31) // 128 - 1, True),
    (16, (1 << 31) // 128, False)])
def test_cache_size_limits_are_typed(page_size, num_pages, ok):
    """Caches the kernels cannot index exactly are refused by name before any launch (so
    ``auto`` falls back): (page, slot, head) rows beyond int32, and for the any-page build
    more than ANY_PAGE_MAX_SLOTS token slots (its float page lookup is exact below that)."""
    cfg = _cfg(page_size=page_size)
    cfg["num_pages"] = num_pages
    if ok:       # passes the size checks, then stops at the device check on this CPU
        with pytest.raises(BackendUnavailableError):
            cute.can_implement("decode", **cfg)
    else:
        with pytest.raises(UnsupportedConfigError, match="cache: "):
            cute.can_implement("decode", **cfg)


def test_any_page_division_is_exact_below_the_limit():
    """The kernel's page lookup: floor(x * rn(1/d)) in float32 plus one correction each way
    (int2_decode_sm90._udiv_rcp) equals x // d for every page size up to 4096 at positions
    spread over [0, ANY_PAGE_MAX_SLOTS) and at the multiples of d around it (numpy model of
    the PTX: cvt.rn.f32.s32, mul.f32 (round to nearest), cvt.rzi.s32.f32)."""
    import numpy as np

    rng = np.random.default_rng(5)
    lim = cute.ANY_PAGE_MAX_SLOTS
    for d in list(range(1, 65)) + [100, 127, 1000, 4095, 4096]:
        edges = (np.arange(lim // d - 3, lim // d + 1) * d)[:, None] + np.array([-1, 0, 1])
        x = np.concatenate([rng.integers(0, lim, 20000), np.arange(0, lim, max(1, lim // 5000)),
                            edges.ravel()])
        x = x[(x >= 0) & (x < lim)].astype(np.int64)
        inv = np.float32(1.0) / np.float32(d)
        q = np.trunc(x.astype(np.float32) * inv).astype(np.int64)
        r = x - q * d
        q = q + (r >= d) - (r < 0)
        assert np.array_equal(q, x // d), d


@pytest.mark.parametrize("num_splits", [0, cute.MAX_SPLITS + 1, 2.0])
def test_explicit_num_splits_out_of_range_is_a_typed_error(num_splits):
    from oscar_kernels import Int2PagedKVCache

    spec = CacheSpec(num_kv_heads=1, head_dim=128, page_size=16)
    cache = Int2PagedKVCache.allocate(spec, 4, 1, device="cpu")
    q = torch.randn(1, 8, 128).to(torch.bfloat16)
    table = [torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
             torch.tensor([5], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)]
    rot = torch.eye(128)[None]
    with pytest.raises(ValueError, match="num_splits: expected an int in"):
        cute.decode_steps(q, cache, *table, rot, rot, 0.1, num_splits=num_splits)


@pytest.mark.parametrize("head_dim,warps", [(128, 2), (128, 16), (64, 8), (128, 8.0)])
def test_explicit_warps_is_checked(head_dim, warps):
    """CTAs of 4 warps at every head_dim, 8 at head_dim 128 only: anything else is a typed
    error naming ``warps`` before any launch."""
    from oscar_kernels import Int2PagedKVCache

    spec = CacheSpec(num_kv_heads=1, head_dim=head_dim, page_size=16)
    cache = Int2PagedKVCache.allocate(spec, 4, 1, device="cpu")
    q = torch.randn(1, 8, head_dim).to(torch.bfloat16)
    table = [torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
             torch.tensor([5], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)]
    rot = torch.eye(head_dim)[None]
    with pytest.raises(ValueError, match=r"warps: expected None, 4 or \(head_dim 128\) 8"):
        cute.decode_steps(q, cache, *table, rot, rot, 0.1, warps=warps)


@pytest.mark.parametrize("page_size", [1, 24])
def test_any_page_build_has_4_warps_only(page_size):
    """Pages that are not a multiple of 16 tokens run the any-page build (CTAs of 4 warps):
    ``warps=8`` there is a typed error naming warps, before any launch."""
    from oscar_kernels import Int2PagedKVCache
    from oscar_kernels.errors import UnsupportedConfigError

    spec = CacheSpec(num_kv_heads=1, head_dim=128, page_size=page_size)
    cache = Int2PagedKVCache.allocate(spec, 4, 1, device="cpu")
    q = torch.randn(1, 4, 128).to(torch.bfloat16)
    table = [torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
             torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)]
    rot = torch.eye(128)[None]
    with pytest.raises(UnsupportedConfigError, match=f"warps: pages of {page_size} tokens"):
        cute.decode_steps(q, cache, *table, rot, rot, 0.1, warps=8, num_splits=2)


@pytest.mark.parametrize("num_splits,gqa", [(17, 8), (33, 4), (65, 2)])
def test_wide_build_refuses_the_merge_kernel(num_splits, gqa):
    """The 8-warp build merges in its fused tail only (its partials stay in the rotated
    space; the merge kernel takes them un-rotated): more than FUSED_TAIL_ROWS partial rows
    with ``warps=8`` is a typed error naming num_splits, before any launch."""
    from oscar_kernels import Int2PagedKVCache
    from oscar_kernels.errors import UnsupportedConfigError

    spec = CacheSpec(num_kv_heads=1, head_dim=128, page_size=16)
    cache = Int2PagedKVCache.allocate(spec, 4, 1, device="cpu")
    q = torch.randn(1, gqa, 128).to(torch.bfloat16)
    table = [torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
             torch.tensor([5], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)]
    rot = torch.eye(128)[None]
    assert num_splits * gqa > cute.FUSED_TAIL_ROWS
    with pytest.raises(UnsupportedConfigError, match=f"num_splits: the 8-warp build merges at "
                       f"most 128 partial rows .* got {num_splits} splits"):
        cute.decode_steps(q, cache, *table, rot, rot, 0.1, warps=8, num_splits=num_splits)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_mma_operand_is_the_fragment_layout(d, shared, transpose):
    """``mma_operand``: element ``((mt * d/16 + ks) * 32 + lane) * 4 + r`` of head h is the
    fp16 pair (A[m, k], A[m, k + 1]) of A = R^T (``transpose``) or R, with
    m = 16 mt + lane // 4 + 8 (r % 2), k = 16 ks + 2 (lane % 4) + 8 (r // 2): the A
    fragment of mma.m16n8k16."""
    h = 3
    g = torch.Generator().manual_seed(d + shared)
    base = torch.linalg.qr(torch.randn(1 if shared else h, d, d, generator=g,
                                       dtype=torch.float64))[0].float()
    rot = base.expand(h, d, d) if shared else base
    frag, stride = cute.mma_operand(rot, transpose)
    assert frag.dtype == torch.int32 and frag.shape == (1 if shared else h, d * d // 2)
    assert stride == (0 if shared else d * d // 2)
    pairs = frag.view(torch.float16).view(frag.shape[0], d // 16, d // 16, 32, 4, 2)
    a16 = rot[: frag.shape[0]]
    a16 = (a16.transpose(-1, -2) if transpose else a16).to(torch.float16)
    lanes = torch.arange(32)
    for r in range(4):
        m = (16 * torch.arange(d // 16)[:, None, None] + (lanes // 4)[None, None, :]
             + 8 * (r % 2))
        k = (16 * torch.arange(d // 16)[None, :, None] + 2 * (lanes % 4)[None, None, :]
             + 8 * (r // 2))
        m, k = torch.broadcast_tensors(m, k)
        for p in range(2):
            assert torch.equal(pairs[:, :, :, :, r, p], a16[:, m, k + p])
    # cached per source tensor; an in-place update of the source is never served stale
    assert cute.mma_operand(rot, transpose)[0] is frag
    base.mul_(-1.0)
    rot = base.expand(h, d, d) if shared else base
    frag2, _ = cute.mma_operand(rot, transpose)
    assert torch.equal(frag2.view(torch.float16), -frag.view(torch.float16))


def _warp_ranges(n_int2: int, n_win: int, nsw: int, cost: int) -> list[tuple[int, int]]:
    """The kernel's INT2 chunk range per warp (Int2PagedDecodeSm90.kernel, "balanced by
    bytes"), written again with Python ints: warp w also runs window chunks w, w + nsw, ..."""
    per_warp = (n_int2 + nsw - 1) // nsw
    full, rem = divmod(n_win, nsw)
    out = []
    for w in range(nsw):
        b = min(n_int2, w * per_warp)
        e = min(n_int2, b + per_warp)
        if n_int2 >= cost * (full + 1) * nsw:
            tot = n_int2 + cost * n_win
            b = (w * tot) // nsw - cost * (w * full + min(w, rem))
            e = ((w + 1) * tot) // nsw - cost * ((w + 1) * full + min(w + 1, rem))
        out.append((b, e))
    return out


def _warp_ranges_ranked(n_int2: int, n_win: int, splits: int, nw: int, c0: int, w0: int,
                        cost: int) -> list[tuple[int, int]]:
    """The wide build's rank-weighted ranges (Int2PagedDecodeSm90.kernel, ``self.ranked``),
    written again with Python ints: splits s < c0 weigh w0, the others RANK_WEIGHT; a split's
    units are shared equally by its nw warps; balanced branch only."""
    from oscar_kernels.cute import RANK_WEIGHT

    nsw = splits * nw
    full, rem = divmod(n_win, nsw)
    tot = n_int2 + cost * n_win
    wt = w0 * c0 + RANK_WEIGHT * (splits - c0)
    out = []
    for s in range(splits):
        a0 = tot * (w0 * min(s, c0) + RANK_WEIGHT * max(s - c0, 0)) // wt
        a1 = tot * (w0 * min(s + 1, c0) + RANK_WEIGHT * max(s + 1 - c0, 0)) // wt
        for w in range(nw):
            k = s * nw + w
            out.append((a0 + w * (a1 - a0) // nw - cost * (k * full + min(k, rem)),
                        a0 + (w + 1) * (a1 - a0) // nw - cost * ((k + 1) * full + min(k + 1, rem))))
    return out


@pytest.mark.parametrize("splits", [1, 2, 4, 8, 16, 64])
def test_rank_weighted_ranges_partition_the_int2_chunks(splits):
    """Rank-weighted shares (the wide build in one wave, sequences long enough: n_int2 >=
    max(RANK_MIN_CHUNKS, 2 x cost x (full + 1)) x nsw): contiguous, in order, cover [0, n_int2) once, every warp's
    range non-empty after its window work, and a rank-0 warp's work (INT2 chunks + cost x
    window chunks) is RANK0_WEIGHT / RANK_WEIGHT a rank-1 warp's to within rounding."""
    from oscar_kernels.cute import RANK0_WEIGHT, RANK_WEIGHT

    cost, nw = cute.WINDOW_CHUNK_COST, 8
    nsw = splits * nw
    gen = torch.Generator().manual_seed(splits)
    for _ in range(30):
        n_win = int(torch.randint(0, 21, (1,), generator=gen))
        full = n_win // nsw
        lo = max(cute.RANK_MIN_CHUNKS, 2 * cost * (full + 1)) * nsw
        n_int2 = lo + int(torch.randint(0, 9000, (1,), generator=gen))
        for c0 in sorted({0, splits // 2, splits - 1, splits} - {-1}):
            for w0 in (RANK_WEIGHT, RANK0_WEIGHT):
                ranges = _warp_ranges_ranked(n_int2, n_win, splits, nw, c0, w0, cost)
                covered = []
                for b, e in ranges:
                    assert 0 <= b < e <= n_int2, (n_int2, n_win, c0, b, e)
                    covered.extend(range(b, e))
                assert covered == list(range(n_int2)), (n_int2, n_win, c0)
                rem = n_win % nsw
                work = [e - b + cost * (full + (k < rem)) for k, (b, e) in enumerate(ranges)]
                r0 = [x for k, x in enumerate(work) if k // nw < c0]
                r1 = [x for k, x in enumerate(work) if k // nw >= c0]
                if r0 and r1:
                    ratio = (sum(r0) / len(r0)) / (sum(r1) / len(r1))
                    assert abs(ratio - w0 / RANK_WEIGHT) < 0.02 + 2 / min(r1), ratio


@pytest.mark.parametrize("nsw", [4, 8, 32, 196, 512])
def test_warp_ranges_partition_the_int2_chunks(nsw):
    """Whichever branch a sequence takes, the warps' INT2 ranges are contiguous, in order and
    cover [0, n_int2) exactly once; balanced ranges give every warp the same work (INT2
    chunks + cost x its window chunks) to within one INT2 chunk."""
    cost = cute.WINDOW_CHUNK_COST
    gen = torch.Generator().manual_seed(nsw)
    cases = [(0, 0), (1, 1), (5, 20), (cost * nsw, 20), (cost * 2 * nsw, 20), (8172, 20),
             (4076, 20), (2028, 20)]
    cases += [(int(n), int(w)) for n, w in zip(torch.randint(0, 9000, (40,), generator=gen),
                                               torch.randint(0, 21, (40,), generator=gen))]
    for n_int2, n_win in cases:
        ranges = _warp_ranges(n_int2, n_win, nsw, cost)
        covered = []
        for b, e in ranges:
            assert 0 <= b <= e <= n_int2, (n_int2, n_win, b, e)
            covered.extend(range(b, e))
        assert covered == list(range(n_int2)), (n_int2, n_win)
        full, rem = divmod(n_win, nsw)
        if n_int2 >= cost * (full + 1) * nsw:
            work = [e - b + cost * (full + (w < rem)) for w, (b, e) in enumerate(ranges)]
            assert max(work) - min(work) <= 1, (n_int2, n_win, work)


def _ticket_state(monkeypatch):
    """_counters' view of torch.cuda, driven by the returned dict (stream, capturing)."""
    state = {"stream": 1, "capturing": False}

    class S:
        def __init__(self, v):
            self.cuda_stream = v
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: S(state["stream"]))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        lambda: state["capturing"])
    for name in ("_COUNTERS", "_SPARES", "_ARENAS"):
        monkeypatch.setattr(cute, name, {})
    monkeypatch.setattr(cute, "_RETIRED", [])
    monkeypatch.delenv("OSCAR_CUTE_TRACE", raising=False)
    return state


def test_ticket_buffers_per_stream_and_private_per_captured_call(monkeypatch):
    """_counters: eager calls share their stream's zeroed buffer (and zero a capture arena
    ahead of time); every call captured into a graph gets its own zeroed, 128-byte aligned
    slice, never handed out again, whatever the stream; a used-up arena is replaced (a new
    zeroed one) and kept alive, as is a replaced stream buffer (graphs hold addresses)."""
    state = _ticket_state(monkeypatch)
    monkeypatch.setattr(cute, "CAPTURE_ARENA_WORDS", 512)
    dev = torch.device("cpu", 0)
    a = cute._counters(dev, 100)
    assert a.numel() == 4096 and int(a.abs().sum()) == 0
    assert cute._counters(dev, 100) is a                       # one buffer per stream
    arena = cute._ARENAS[0][0]
    assert arena.numel() == 512 and int(arena.abs().sum()) == 0
    state.update(capturing=True)                               # captured on the same stream
    b = cute._counters(dev, 100)
    c = cute._counters(dev, 300)
    state.update(stream=2)                                     # ... and on another
    d = cute._counters(dev, 1)
    slices = [b, c, d]
    assert [t.numel() for t in slices] == [100, 300, 1]
    starts = [(t.data_ptr() - arena.data_ptr()) // 4 for t in slices]
    assert starts == [0, 128, 448]                             # disjoint, 32-word aligned
    assert all(t.untyped_storage().data_ptr() == arena.data_ptr() for t in slices)
    assert all(int(t.abs().sum()) == 0 for t in slices) and a.data_ptr() != b.data_ptr()
    e = cute._counters(dev, 100)                               # 480 + 128 > 512: new arena
    assert e.data_ptr() == cute._ARENAS[0][0].data_ptr() != arena.data_ptr()
    assert any(t is arena for t in cute._RETIRED) and int(e.abs().sum()) == 0
    huge = cute._counters(dev, 5000)                           # larger than an arena
    assert huge.numel() == 5000 and int(huge.abs().sum()) == 0
    state.update(stream=1, capturing=False)                    # larger: old one retired
    big = cute._counters(dev, 5000)
    assert big.numel() == 5000 and any(a is t for t in cute._RETIRED)


def test_ticket_buffers_trace_builds_keep_one_per_stream(monkeypatch):
    """With OSCAR_CUTE_TRACE (debug trace builds, perf/trace_decode.py) captured calls use
    their stream's buffer: a stream first seen while capturing takes a spare zeroed ahead
    (no fill inside the graph)."""
    state = _ticket_state(monkeypatch)
    monkeypatch.setenv("OSCAR_CUTE_TRACE", "1")
    dev = torch.device("cpu", 0)
    a = cute._counters(dev, 100)
    assert a.numel() == cute.TRACE_OFFSET // 4 + (1 << 22) and int(a.abs().sum()) == 0
    spares = list(cute._SPARES[0])
    assert len(spares) == cute.SPARE_TICKET_BUFFERS
    state.update(stream=2, capturing=True)                     # a fresh capture stream
    b = cute._counters(dev, 100)
    assert any(b is t for t in spares) and not any(b is t for t in cute._SPARES[0])
    assert cute._counters(dev, 100) is b                       # that stream's buffer now


def test_merge_cta_plan(monkeypatch):
    """The merge-CTA build runs wide pair calls (GQA <= 4) with MERGE_CTA_MIN_SPLITS+ splits
    merged in the fused tail when the split CTAs plus one merge CTA per (sequence, KV head)
    fit one wave of 2 CTAs per SM: qwen3-8b (8 KV heads) batch 1 at the plan's 16 splits;
    OSCAR_CUTE_MERGE_CTAS=1 wherever it can run, =0 never."""
    from oscar_kernels import cute

    monkeypatch.delenv("OSCAR_CUTE_MERGE_CTAS", raising=False)
    assert cute.plan(1, 8, 132, 4, 128, True) == (8, 16)
    assert cute.use_merge_ctas(8, 16, 132, 4)
    assert not cute.use_merge_ctas(16, 8, 132, 4)        # batch 2: 8 splits
    assert not cute.use_merge_ctas(8, 16, 60, 4)         # 136 CTAs > 2 per SM x 60 SMs
    assert not cute.use_merge_ctas(8, 16, 132, 8)        # GQA 8: the decode build
    assert not cute.use_merge_ctas(1, 40, 132, 4)        # 160 rows: the merge kernel
    monkeypatch.setenv("OSCAR_CUTE_MERGE_CTAS", "1")
    assert cute.use_merge_ctas(64, 4, 132, 4) and not cute.use_merge_ctas(8, 1, 132, 4)
    monkeypatch.setenv("OSCAR_CUTE_MERGE_CTAS", "0")
    assert not cute.use_merge_ctas(8, 16, 132, 4)


def test_merge_ctas_forced_where_they_cannot_run_is_a_typed_error():
    from oscar_kernels import Int2PagedKVCache
    from oscar_kernels.errors import UnsupportedConfigError

    spec = CacheSpec(num_kv_heads=1, head_dim=128, page_size=16)
    cache = Int2PagedKVCache.allocate(spec, 4, 1, device="cpu")
    table = [torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
             torch.tensor([5], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)]
    rot = torch.eye(128)[None]
    for gqa, warps, splits in ((4, 4, 4), (8, 8, 4), (4, 8, 1)):
        q = torch.randn(1, gqa, 128).to(torch.bfloat16)
        with pytest.raises(UnsupportedConfigError, match="merge_ctas: the merge-CTA build"):
            cute.decode_steps(q, cache, *table, rot, rot, 0.1, warps=warps, num_splits=splits,
                              merge_ctas=True)


def test_launch_op_names_the_build_a_call_runs():
    """``launch_op`` (what ``decode_steps`` launches, and ``perf/trace_decode.py`` reads): the
    op per GQA class and page size, the merge-CTA and 4-deep ring builds by the plan's rule or
    forced, typed errors; no device query unless the merge-CTA choice (GQA <= 4, 8 warps, 2+
    splits) or the 4-warp ring-4 choice is the plan's."""
    from oscar_kernels.errors import UnsupportedConfigError

    dev = torch.device("cuda", 0)    # never queried below
    assert cute.launch_op(1, 1, 8, 128, 8, 4, dev) == "decode"
    assert cute.launch_op(1, 1, 4, 128, 4, 40, dev, ring4=False) == "decode_pair"
    assert cute.launch_op(1, 1, 4, 128, 8, 1, dev, ring4=False) == "decode_pair"
    assert cute.launch_op(1, 1, 3, 64, 4, 3, dev, any_page=True) == "decode_pair_anypage"
    assert cute.launch_op(1, 1, 3, 64, 4, 3, dev) == "decode_pair"      # no ring-4 build at 64
    assert cute.launch_op(1, 8, 4, 128, 8, 16, dev, merge_ctas=False, ring4=False) == "decode_pair"
    if cute._bundle.has_kernel("decode_pair_mc", 128, 8):
        assert cute.launch_op(1, 8, 4, 128, 8, 16, dev, merge_ctas=True) == "decode_pair_mc"
    if cute._bundle.has_kernel("decode_pair_ring4", 128, 8):
        # the wide plans of qwen3-8b batch 2 (16 splits) and 4 (8) take the 4-deep ring,
        # batch 8 (4 splits) not; forced either way
        assert cute.launch_op(2, 8, 4, 128, 8, 16, dev, merge_ctas=False) == "decode_pair_ring4"
        assert cute.launch_op(4, 8, 4, 128, 8, 8, dev, merge_ctas=False) == "decode_pair_ring4"
        assert cute.launch_op(8, 8, 4, 128, 8, 4, dev, merge_ctas=False) == "decode_pair"
        assert cute.launch_op(32, 8, 4, 128, 8, 1, dev) == "decode_pair_ring4"   # one split
        kw = {"merge_ctas": False}
        assert cute.launch_op(8, 8, 4, 128, 8, 4, dev, ring4=True, **kw) == "decode_pair_ring4"
        assert cute.launch_op(4, 8, 4, 128, 8, 8, dev, ring4=False, **kw) == "decode_pair"
        assert cute.launch_op(1, 8, 4, 128, 4, 3, dev, ring4=True) == "decode_pair_ring4"
    with pytest.raises(UnsupportedConfigError, match="num_splits: the 8-warp build merges"):
        cute.launch_op(1, 1, 8, 128, 8, 17, dev)
    with pytest.raises(UnsupportedConfigError, match="merge_ctas: the merge-CTA build"):
        cute.launch_op(1, 1, 8, 128, 8, 4, dev, merge_ctas=True)
    for args in ((1, 1, 8, 128, 4, 4), (1, 1, 4, 64, 4, 4), (1, 1, 4, 128, 4, 4, dev, True)):
        with pytest.raises(UnsupportedConfigError, match="ring4: the 4-deep ring build"):
            cute.launch_op(*args[:6], dev, *args[7:], ring4=True)


def test_use_ring4_follows_the_measured_shapes(monkeypatch):
    """The 4-deep ring pair build: wide calls from RING4_MIN_SPLITS splits (qwen3-8b batch
    2-6) or with one split (batch 27-33), not with 2-4 (batch 7-16), 4-warp calls whose grid
    is one wave (qwen3-8b batch 64 on 132 SMs: 512 CTAs; not batch 128), and the environment
    override both ways."""
    monkeypatch.delenv("OSCAR_CUTE_RING4", raising=False)
    assert cute.use_ring4(16, 16, 0, 8) and cute.use_ring4(32, 8, 0, 8)
    assert cute.use_ring4(40, 6, 0, 8) and cute.use_ring4(256, 1, 0, 8)
    assert not cute.use_ring4(64, 4, 0, 8) and not cute.use_ring4(128, 2, 0, 8)
    assert cute.use_ring4(512, 1, 132, 4) and not cute.use_ring4(1024, 1, 132, 4)
    for b, want in ((2, True), (4, True), (5, True), (6, True), (8, False), (16, False),
                    (32, True)):
        warps, splits = cute.plan(b, 8, 132, 4, 128)
        assert warps == 8 and cute.use_ring4(b * 8, splits, 132, warps) == want, b
    monkeypatch.setenv("OSCAR_CUTE_RING4", "0")
    assert not cute.use_ring4(16, 16, 0, 8)
    monkeypatch.setenv("OSCAR_CUTE_RING4", "1")
    assert cute.use_ring4(1024, 1, 132, 4)


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
        batch_size, num_kv_heads, group, head_dim, max_kv_len, want, monkeypatch):
    monkeypatch.delenv("OSCAR_CUTE_LENGTH_HINT", raising=False)
    shapes = cute.plan(batch_size, num_kv_heads, 132, group, head_dim)
    assert cute.plan(batch_size, num_kv_heads, 132, group, head_dim, True, None) == shapes
    assert cute.plan(batch_size, num_kv_heads, 132, group, head_dim, True, max_kv_len) == want
    monkeypatch.setenv("OSCAR_CUTE_LENGTH_HINT", "0")
    assert cute.plan(batch_size, num_kv_heads, 132, group, head_dim, True, max_kv_len) == shapes


def test_length_hint_plans_stay_launchable():
    """Over every batch 1-256 and length of the three presets, the hint only lowers the split
    count of the shapes' plan (or, for short sequences, of the wide plan the shapes traded
    for a lighter 4-warp wave), keeps the merge path, and never plans a wide call whose
    partials would need the merge kernel."""
    for h, group, d in ((8, 4, 128), (1, 8, 128), (3, 3, 64)):
        for b in range(1, 257):
            w0, s0 = cute.plan(b, h, 132, group, d)
            for n in (0, 1, 300, 2048, 4096, 12000, 16384, 50000, 131072, 1 << 20):
                w, s = cute.plan(b, h, 132, group, d, True, n)
                top = s0
                if w != w0:
                    assert (w0, w) == (4, 8) and group <= cute.PAIR_MAX_GROUP, (h, b, n)
                    top = cute.num_splits_for(b, h, 132, group, warps=8)
                assert 1 <= s <= top, (h, b, n)
                assert (s * group > cute.FUSED_TAIL_ROWS) == (top * group > cute.FUSED_TAIL_ROWS)
                assert w == 4 or s * group <= cute.FUSED_TAIL_ROWS
                if s < top:
                    assert b * h * s <= 132 < b * h * top


def test_length_hint_takes_the_4_deep_ring_for_short_pair_calls(monkeypatch):
    """A warp's share of at most RING4_WARP_TOKENS tokens: qwen3-8b batch 8 (4 wide splits)
    up to 32K, batch 16 (2 splits) up to 16K, batch 24 (4 warps x 11 splits, four waves) up
    to 22K; the shape rule's choices stay (the hint only adds the shallow ring)."""
    monkeypatch.delenv("OSCAR_CUTE_RING4", raising=False)
    monkeypatch.delenv("OSCAR_CUTE_LENGTH_HINT", raising=False)
    assert cute.use_ring4(64, 4, 0, 8, 32768) and not cute.use_ring4(64, 4, 0, 8, 32769)
    assert cute.use_ring4(128, 2, 0, 8, 16384) and not cute.use_ring4(128, 2, 0, 8, 65536)
    assert cute.use_ring4(192, 11, 132, 4, 16384) and not cute.use_ring4(192, 11, 132, 4, 32768)
    assert cute.use_ring4(40, 6, 0, 8, 1 << 20) and cute.use_ring4(256, 1, 0, 8, 1 << 20)
    assert not cute.use_ring4(64, 4, 0, 8, None)
    monkeypatch.setenv("OSCAR_CUTE_LENGTH_HINT", "0")
    assert not cute.use_ring4(64, 4, 0, 8, 4096)
    monkeypatch.setenv("OSCAR_CUTE_RING4", "0")
    monkeypatch.delenv("OSCAR_CUTE_LENGTH_HINT")
    assert not cute.use_ring4(64, 4, 0, 8, 4096)
    if cute._bundle.has_kernel("decode_pair_ring4", 128, 8):
        monkeypatch.delenv("OSCAR_CUTE_RING4")
        dev, kw = torch.device("cuda", 0), {"merge_ctas": False}   # device never queried
        assert cute.launch_op(8, 8, 4, 128, 8, 4, dev, max_kv_len=8192,
                              **kw) == "decode_pair_ring4"
        assert cute.launch_op(8, 8, 4, 128, 8, 4, dev, max_kv_len=65536, **kw) == "decode_pair"
