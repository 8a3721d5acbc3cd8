"""The launcher's checks without a GPU (:mod:`oscar_kernels.cute.launch`): can_implement,
the auto fallback, typed errors for explicit plans the builds cannot run. The kernels run
in test_cute_gpu.py."""

from __future__ import annotations

import logging

import pytest
import torch

from oscar_kernels import CacheSpec, cute
from oscar_kernels.cute import config, launch
from oscar_kernels.errors import BackendUnavailableError, UnsupportedConfigError


def _cfg(**kw):
    spec = CacheSpec(**{"num_kv_heads": 8, "head_dim": 128, "page_size": 16, **kw})
    return {"device": torch.device("cpu"), "spec": spec, "num_qo_heads": 32,
            "dtype": torch.bfloat16}


@pytest.mark.parametrize("op", ["append", "extend"])
def test_only_decode_is_implemented(op):
    with pytest.raises(UnsupportedConfigError, match="decode only"):
        launch.can_implement(op, **_cfg())
    with pytest.raises(UnsupportedConfigError):
        getattr(cute, op)()


def test_cpu_device_is_unavailable():
    with pytest.raises(BackendUnavailableError, match="sm_90"):
        launch.can_implement("decode", **_cfg())


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
        launch.can_implement("decode", **cfg)


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
            launch.can_implement("decode", **cfg)
    else:
        with pytest.raises(UnsupportedConfigError, match="cache: "):
            launch.can_implement("decode", **cfg)


@pytest.mark.parametrize("num_splits", [0, config.MAX_SPLITS + 1, 2.0])
def test_explicit_num_splits_out_of_range_is_a_typed_error(num_splits):
    from oscar_kernels import Int2PagedKVCache

    spec = CacheSpec(num_kv_heads=1, head_dim=128, page_size=16)
    cache = Int2PagedKVCache.allocate(spec, 4, 1, device="cpu")
    q = torch.randn(1, 8, 128).to(torch.bfloat16)
    table = [torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
             torch.tensor([5], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)]
    rot = torch.eye(128)[None]
    with pytest.raises(ValueError, match="num_splits: expected an int in"):
        launch.decode_steps(q, cache, *table, rot, rot, 0.1, num_splits=num_splits)


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
        launch.decode_steps(q, cache, *table, rot, rot, 0.1, warps=warps)


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
        launch.decode_steps(q, cache, *table, rot, rot, 0.1, warps=8, num_splits=2)


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
    assert num_splits * gqa > config.FUSED_TAIL_ROWS
    with pytest.raises(UnsupportedConfigError, match=f"num_splits: the 8-warp build merges at "
                       f"most 128 partial rows .* got {num_splits} splits"):
        launch.decode_steps(q, cache, *table, rot, rot, 0.1, warps=8, num_splits=num_splits)


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
            launch.decode_steps(q, cache, *table, rot, rot, 0.1, warps=warps, num_splits=splits,
                              merge_ctas=True)
