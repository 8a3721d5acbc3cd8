"""The compile key and the one ABI list (:mod:`oscar_kernels.cute.config`), checked against
the kernels' source (parsed, not imported: no cutlass needed)."""

from __future__ import annotations

import ast
import ctypes
import os

import pytest

from oscar_kernels.cute import bundle, config
from oscar_kernels.cute.config import Int2DecodeConfig

CUTE = os.path.join(os.path.dirname(__file__), "..", "..", "oscar_kernels", "cute")


def _launcher_params(filename: str, cls: str) -> list[tuple[str, str]]:
    """``(name, annotation)`` of the host launcher ``cls.__call__`` in ``filename``."""
    with open(os.path.join(CUTE, filename)) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__call__":
                    return [(a.arg, ast.unparse(a.annotation)) for a in fn.args.args[1:]]
    raise AssertionError(f"{cls}.__call__ not found in {filename}")


@pytest.mark.parametrize("filename,cls,ptrs,ints,floats", [
    ("decode_sm90.py", "Int2PagedDecodeSm90", config.DECODE_PTR_ARGS, config.DECODE_INT_ARGS, 1),
    ("merge_sm90.py", "Int2DecodeMergeSm90", config.MERGE_PTR_ARGS, config.MERGE_INT_ARGS, 0)])
def test_launchers_follow_the_abi_list(filename, cls, ptrs, ints, floats):
    """The kernels' host launchers take the ABI list's pointers (Int64), then its ints
    (Int32), the float(s) and the stream, in that order; the bundle's ctypes match."""
    params = _launcher_params(filename, cls)
    kinds = [ann for _, ann in params]
    assert kinds == (["Int64"] * len(ptrs) + ["Int32"] * len(ints) + ["Float32"] * floats
                     + ["cuda.CUstream"])
    if floats:   # the decode launcher spells its int arguments as the list does
        names = [n for n, _ in params]
        assert names[len(ptrs):len(ptrs) + len(ints)] == list(ints)
    op = "decode" if floats else "merge"
    argtypes = bundle._ARGTYPES[op]
    assert argtypes == ([ctypes.c_int64] * len(ptrs) + [ctypes.c_int32] * len(ints)
                        + [ctypes.c_float] * floats + [ctypes.c_void_p])


def test_abi_names_are_unique():
    for names in (config.DECODE_PTR_ARGS, config.DECODE_INT_ARGS, config.MERGE_PTR_ARGS,
                  config.MERGE_INT_ARGS):
        assert len(set(names)) == len(names)
    assert set(config.MERGE_PTR_ARGS) <= set(config.DECODE_PTR_ARGS)
    assert set(config.MERGE_INT_ARGS) <= set(config.DECODE_INT_ARGS)


def test_config_names_and_ring_depths():
    assert Int2DecodeConfig(128).name == "int2_decode_sm90_d128"
    assert Int2DecodeConfig(128, pair=True, warps=8, merge_ctas=True).name == (
        "int2_decode_pair_mc_w8_sm90_d128")
    assert Int2DecodeConfig(128, pair=True, stages=4).name == "int2_decode_pair_ring4_sm90_d128"
    assert Int2DecodeConfig(64, pair=True, any_page=True).name == (
        "int2_decode_pair_anypage_sm90_d64")
    assert Int2DecodeConfig(64).merge_name == "int2_decode_merge_sm90_d64"
    # debug and measurement variants keep the build's name (a debug bundle has the same ops)
    assert Int2DecodeConfig(128, debug={"trace", "pro"}, k_operands="masked",
                            rank_weights=(5, 4)).name == "int2_decode_sm90_d128"
    assert Int2DecodeConfig(128).ring == config.SHALLOW_STAGES          # decode, GQA > 4
    assert Int2DecodeConfig(128, pair=True).ring == config.DEEP_STAGES
    assert Int2DecodeConfig(64).ring == config.DEEP_STAGES
    assert Int2DecodeConfig(128, pair=True, warps=8, merge_ctas=True).ring == (
        config.SHALLOW_STAGES)


def test_k_operand_forms():
    form = config.k_operand_form
    assert form(Int2DecodeConfig(64)) == "none"
    assert form(Int2DecodeConfig(128)) == "top"
    assert form(Int2DecodeConfig(128, pair=True)) == "unmasked"
    assert form(Int2DecodeConfig(128, pair=True, warps=8)) == "masked"
    assert form(Int2DecodeConfig(128, pair=True, warps=8, stages=4)) == "unmasked"
    assert form(Int2DecodeConfig(128, k_operands="masked")) == "masked"


@pytest.mark.parametrize("kw,match", [
    ({"stages": 6}, "stages"), ({"stages": 2}, "stages"), ({"k_operands": "half"}, "k_operands"),
    ({"rank_weights": (3,)}, "rank_weights"), ({"rank_weights": (3, 0)}, "rank_weights"),
    ({"debug": {"trace", "bogus"}}, "unknown flags"),
    ({"debug": {"trace", "clk", "pro"}}, "same trace slots")])
def test_config_rejects_bad_variants(kw, match):
    with pytest.raises(ValueError, match=match):
        Int2DecodeConfig(128, **kw)


def test_debug_flags_are_a_frozenset():
    c = Int2DecodeConfig(128, debug=["trace"])
    assert c.debug == frozenset({"trace"}) and hash(c) == hash(Int2DecodeConfig(
        128, debug=frozenset({"trace"})))
