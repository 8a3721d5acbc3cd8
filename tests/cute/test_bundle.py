"""The kernel bundle and its loader (:mod:`oscar_kernels.cute.bundle`): the shipped manifest,
the list of builds, typed errors for a missing or bad bundle, the one selector."""

from __future__ import annotations

import json

import pytest

from oscar_kernels.cute import bundle, config, plan
from oscar_kernels.errors import BackendUnavailableError


def test_prebuilt_manifest_lists_both_head_dims(monkeypatch):
    monkeypatch.delenv("OSCAR_CUTE_BUNDLE", raising=False)
    manifest = bundle.read_manifest()
    kernels = manifest["kernels"]
    assert {k["head_dim"] for k in kernels.values()} == {64, 128}
    for entry in kernels.values():
        assert entry["arch"] == "sm_90a"
        import os
        assert os.path.getsize(os.path.join(bundle.bundle_dir(), entry["library"])) < 2 << 20


def test_prebuilt_bundle_has_every_op_per_head_dim(monkeypatch):
    """decode (GQA > 4), decode_pair (GQA <= 4: two chunks per softmax pass), their any-page
    builds and merge, for both head dims, under the names the loader looks up; decode_pair,
    the any-page builds and the merge-CTA build have decode's C ABI."""
    monkeypatch.delenv("OSCAR_CUTE_BUNDLE", raising=False)
    kernels = bundle.read_manifest()["kernels"]
    assert set(bundle.OPS) == {"decode", "decode_pair", "merge", "decode_anypage",
                                "decode_pair_anypage", "decode_pair_mc", "decode_pair_ring4"}
    assert set(bundle.CORE_OPS) == {"decode", "decode_pair", "merge"}
    d128_only = {"decode_pair_mc", "decode_pair_ring4"}
    for d in (64, 128):
        for op in set(bundle.OPS) - d128_only:
            entry = kernels[bundle.kernel_name(op, d)]
            assert (entry["op"], entry["head_dim"], entry["warps"]) == (op, d, 4)
    # the wide build (8 warps per CTA) of both decode ops, the merge-CTA build (wide pair)
    # and the 4-deep ring pair build (4 and 8 warps), head_dim 128 only
    for op in ("decode", "decode_pair", "decode_pair_mc", "decode_pair_ring4"):
        entry = kernels[bundle.kernel_name(op, 128, 8)]
        assert (entry["op"], entry["head_dim"], entry["warps"]) == (op, 128, 8)
        assert bundle.has_kernel(op, 128, 8) and not bundle.has_kernel(op, 64, 8)
    entry = kernels[bundle.kernel_name("decode_pair_ring4", 128)]
    assert (entry["op"], entry["head_dim"], entry["warps"]) == ("decode_pair_ring4", 128, 4)
    assert not bundle.has_kernel("decode_pair_ring4", 64, 4)
    assert not bundle.has_kernel("decode_pair_mc", 128, 4)
    assert len(kernels) == 2 * (len(bundle.OPS) - 2) + 3 + 2
    assert plan.decode_op(4) == "decode_pair" and plan.decode_op(5) == "decode"
    assert plan.decode_op(4, True) == "decode_pair_anypage"
    assert plan.decode_op(8, True) == "decode_anypage"
    if bundle.mode() == "bundle":
        assert plan.wide_available(4, 128) and plan.wide_available(8, 128)
        assert not plan.wide_available(4, 64)
    assert not plan.wide_available(4, 128, any_page=True)     # 4 warps only
    for op in ("decode_pair", "decode_anypage", "decode_pair_anypage", "decode_pair_mc",
               "decode_pair_ring4"):
        assert bundle._ARGTYPES[op] == bundle._ARGTYPES["decode"]
    assert config.PAIR_MAX_GROUP == 4   # the pair kernel holds the heads in MMA columns 0-3


def test_build_options_list_exactly_the_bundled_builds(monkeypatch):
    """bundle.build_options is the one list of builds (aot build, JIT mode, has_kernel's JIT
    answer): exactly the (op, head_dim, warps) of the shipped bundle, each under the name the
    loader looks up, with the ring depth and flags its op names."""
    monkeypatch.delenv("OSCAR_CUTE_BUNDLE", raising=False)
    kernels = bundle.read_manifest()["kernels"]
    listed = {(op, d, w) for op in bundle.OPS for d in (64, 128) for w in config.CTA_WARPS
              if bundle.build_options(op, d, w) is not None}
    assert listed == {(e["op"], e["head_dim"], e["warps"]) for e in kernels.values()}
    for op, d, w in listed:
        assert bundle.kernel_name(op, d, w) in kernels
    assert bundle.build_options("decode_pair_ring4", 128, 8) == {
        "head_dim": 128, "pair": True, "warps": 8, "any_page": False, "merge_ctas": False,
        "stages": 4}
    assert bundle.build_options("decode_anypage", 64)["any_page"]
    assert bundle.build_options("decode_pair_mc", 128, 8)["merge_ctas"]
    for bad in (("decode_pair_mc", 128, 4), ("decode_pair_ring4", 64, 4), ("decode", 64, 8),
                ("merge", 128, 8), ("decode_anypage", 128, 8), ("decode", 128, 16),
                ("prefill", 128, 4)):
        assert bundle.build_options(*bad) is None
    monkeypatch.setattr(bundle, "mode", lambda: "jit")
    for op in bundle.OPS:
        for w in config.CTA_WARPS:
            assert bundle.has_kernel(op, 128, w) == ((op, 128, w) in listed)


def test_missing_or_bad_bundle_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CUTE_BUNDLE", str(tmp_path))
    with pytest.raises(BackendUnavailableError, match="manifest.json missing"):
        bundle.available_head_dims()
    (tmp_path / "manifest.json").write_text(json.dumps({"bundle_format": 99, "kernels": {}}))
    with pytest.raises(BackendUnavailableError, match="bundle_format"):
        bundle.read_manifest()
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BackendUnavailableError, match="unreadable"):
        bundle.read_manifest()
    # bundles of older kernel ABIs (format 1: float32 R_K / R_V; 2: un-rotated partials and
    # a merge kernel taking R_V) are refused by name
    for old in (1, 2):
        (tmp_path / "manifest.json").write_text(json.dumps({"bundle_format": old, "kernels": {}}))
        with pytest.raises(BackendUnavailableError, match=f"expected bundle_format 3, got {old}"):
            bundle.read_manifest()
    (tmp_path / "manifest.json").write_text(json.dumps({"bundle_format": bundle.BUNDLE_FORMAT, "kernels": {
        "int2_decode_sm90_d128": {"op": "decode", "head_dim": 128, "library": "libnone.so"}}}))
    with pytest.raises(BackendUnavailableError, match="no decode kernel"):
        bundle.available_head_dims()


def test_manifest_is_read_again_only_when_it_changes(tmp_path, monkeypatch):
    """Every decode call asks which builds exist: the manifest is parsed once per version of
    the file (one stat per call), and has_kernel / available_head_dims follow a rewrite."""
    monkeypatch.setenv("OSCAR_CUTE_BUNDLE", str(tmp_path))
    (tmp_path / "libx.so").write_bytes(b"")

    def write(kernels):
        (tmp_path / "manifest.json").write_text(json.dumps(
            {"bundle_format": bundle.BUNDLE_FORMAT, "kernels": kernels}))

    name = bundle.kernel_name("decode_pair_ring4", 128, 8)
    write({name: {"op": "decode_pair_ring4", "head_dim": 128, "warps": 8, "library": "libx.so"}})
    first = bundle.read_manifest()
    assert bundle.read_manifest() is first                       # cached
    assert bundle.has_kernel("decode_pair_ring4", 128, 8)
    assert not bundle.has_kernel("decode_pair_ring4", 128, 4)
    with pytest.raises(BackendUnavailableError, match="no decode kernel"):
        bundle.available_head_dims()
    write({bundle.kernel_name(op, 64): {"op": op, "head_dim": 64, "library": "libx.so"}
           for op in bundle.CORE_OPS})                            # a rebuilt bundle
    assert bundle.read_manifest() is not first
    assert not bundle.has_kernel("decode_pair_ring4", 128, 8)
    assert bundle.available_head_dims() == (64,)


def test_bundle_env_is_the_one_selector(monkeypatch, tmp_path):
    """``$OSCAR_CUTE_BUNDLE`` names the bundle to load (bundle mode even with the DSL
    installed); unset: JIT with the DSL, else the shipped bundle."""
    monkeypatch.setenv("OSCAR_CUTE_BUNDLE", str(tmp_path))
    assert bundle.mode() == "bundle" and bundle.bundle_dir() == str(tmp_path)
    monkeypatch.delenv("OSCAR_CUTE_BUNDLE")
    assert bundle.mode() == ("jit" if bundle.cutlass_available() else "bundle")
    assert bundle.bundle_dir().endswith("prebuilt")


def test_the_selector_is_the_only_environment_variable_read():
    """The CuTe backend reads ``OSCAR_CUTE_BUNDLE`` and nothing else from the environment
    (the DSL's ``CUTE_DSL_ARCH`` is only defaulted to sm_90a before compiling)."""
    import os
    import re

    root = os.path.dirname(bundle.__file__)
    reads = set()
    for f in sorted(os.listdir(root)):
        if f.endswith(".py"):
            with open(os.path.join(root, f)) as fh:
                src = fh.read()
            reads |= {m.strip("'\"") for m in re.findall(
                r"os\.environ(?:\.get|\.setdefault)?[\[(]\s*([\w\"']+)", src)}
            assert "getenv" not in src, f
    assert reads == {"BUNDLE_ENV", "CUTE_DSL_ARCH"}, reads
    assert bundle.BUNDLE_ENV == "OSCAR_CUTE_BUNDLE"
