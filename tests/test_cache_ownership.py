"""Each op writes only the cache bytes it owns and reads no poisoned byte.

The cache starts poisoned (codes 0xA5, NaN params and window rows) with spare pages and
window slots; the sequences' own earlier tokens are then written by the reference append.
After a decode (read only), an extend or an append, every byte outside the page slots and
window rows of the call's own new positions must be unchanged (compared as raw bytes, so
NaN == NaN), and the outputs must be finite. CPU: reference and Triton (interpreter); GPU
(``-m gpu``): Triton and, for decode, CuTe.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from oscar_kernels import CacheSpec, ops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "triton"))
from triton_cases import build_case, offsets  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _spec(layout="NHD", page_size=4):
    return CacheSpec(num_kv_heads=2, head_dim=64, page_size=page_size, sink_size=4,
                     recent_size=8, kv_layout=layout)


def _bytes(cache) -> dict:
    return {n: t.detach().clone().view(torch.uint8).cpu() for n, t in cache.tensors().items()}


def _owned_mask(cache, case, new_positions) -> dict:
    """``{tensor name: bool mask}`` of the bytes the writes of ``new_positions[b]`` own."""
    spec = cache.spec
    masks = {n: torch.zeros(t.shape, dtype=torch.bool) for n, t in cache.tensors().items()}
    indptr, indices = case["kv_indptr"].cpu(), case["kv_indices"].cpu()
    for b, positions in enumerate(new_positions):
        slot = int(case["window_slots"][b])
        for p in positions:
            page = int(indices[int(indptr[b]) + p // spec.page_size])
            s = p % spec.page_size
            for name in ("k_codes", "v_codes", "k_params", "v_params"):
                if spec.kv_layout == "NHD":
                    masks[name][page, s] = True
                else:
                    masks[name][page, :, s] = True
            row = p if p < spec.sink_size else spec.sink_size + p % spec.recent_size
            for name in ("k_window", "v_window"):
                masks[name][slot, row] = True
    return masks


def _assert_only_owned_changed(before: dict, cache, owned: dict) -> None:
    after = _bytes(cache)
    for name, b in before.items():
        a = after[name]
        keep = ~owned[name]
        elem = b.shape[-1] // owned[name].shape[-1]       # bytes per element
        keep_b = keep.repeat_interleave(elem, dim=-1)
        changed = (a != b) & keep_b
        assert not bool(changed.any()), f"{name}: {int(changed.sum())} bytes outside the call's slots changed"


def _case(layout, lens, prefix, gqa=2, seed=0):
    spec = _spec(layout)
    case = build_case(spec, lens, spec.num_kv_heads * gqa, torch.Generator().manual_seed(seed),
                      device=DEV, prefix_lens=prefix, spare_slots=2)
    return spec, case


BACKENDS = ["reference", "triton"] + (["cute"] if DEV == "cuda" else [])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("backend", ["reference", "triton", "triton-dense"])
def test_extend_writes_only_its_chunk(layout, backend, monkeypatch):
    if backend == "triton-dense":          # the INT2 part as dequantize + dense attention
        from oscar_kernels.triton import paged_extend as pe
        monkeypatch.setattr(pe, "EXTEND_INT2_DENSE", True)
        backend = "triton"
    lens, chunks = [30, 9, 21], [11, 9, 1]        # a chunk over the ring, a whole prompt, one token
    prefix = [n - c for n, c in zip(lens, chunks)]
    spec, case = _case(layout, lens, prefix)
    sel = torch.cat([torch.arange(o + p, o + n) for o, p, n in
                     zip(offsets(lens), prefix, lens)]).to(DEV)
    qo = torch.tensor([0] + torch.tensor(chunks).cumsum(0).tolist(), dtype=torch.int32,
                      device=DEV)
    q = torch.randn(len(sel), spec.num_kv_heads * 2, spec.head_dim,
                    generator=torch.Generator().manual_seed(1)).to(DEV)
    before = _bytes(case["cache"])
    out = torch.full_like(q, float("nan"))
    o, lse = ops.paged_extend_attention(
        q, case["k"][sel], case["v"][sel], qo, case["cache"], case["kv_indptr"],
        case["kv_indices"], case["kv_last_page_len"], case["window_slots"], case["rot"],
        out=out, return_lse=True, backend=backend)
    assert bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse).all())
    owned = _owned_mask(case["cache"], case, [range(p, n) for p, n in zip(prefix, lens)])
    _assert_only_owned_changed(before, case["cache"], owned)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_reads_only(layout, backend):
    if backend == "cute" and layout == "NHD":
        pytest.skip("the CuTe decode reads HND and NHD alike; one layout is enough here")
    lens = [30, 1, 17]
    spec, case = _case(layout, lens, None, gqa=4, seed=2)
    q = torch.randn(len(lens), spec.num_kv_heads * 4, spec.head_dim,
                    generator=torch.Generator().manual_seed(3)).to(DEV)
    if backend == "cute":
        q = q.to(torch.bfloat16)
    before = _bytes(case["cache"])
    o = ops.paged_decode_attention(q, case["cache"], case["kv_indptr"], case["kv_indices"],
                                   case["kv_last_page_len"], case["window_slots"], case["rot"],
                                   backend=backend)
    assert bool(torch.isfinite(o).all())
    nothing = {n: torch.zeros(t.shape, dtype=torch.bool) for n, t in case["cache"].tensors().items()}
    _assert_only_owned_changed(before, case["cache"], nothing)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_append_writes_only_its_tokens(layout, backend):
    lens, new = [30, 6, 13], [1, 3, 9]
    prefix = [n - c for n, c in zip(lens, new)]
    spec, case = _case(layout, lens, prefix, seed=4)
    sel = torch.cat([torch.arange(o + p, o + n) for o, p, n in
                     zip(offsets(lens), prefix, lens)]).to(DEV)
    bi = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(new)).to(torch.int32).to(DEV)
    pos = torch.cat([torch.arange(p, n) for p, n in zip(prefix, lens)]).to(torch.int32).to(DEV)
    before = _bytes(case["cache"])
    ops.quantize_append_paged_kv_cache(case["k"][sel], case["v"][sel], bi, pos, case["cache"],
                                       case["kv_indices"], case["kv_indptr"],
                                       case["kv_last_page_len"], case["window_slots"],
                                       case["rot"], backend=backend)
    owned = _owned_mask(case["cache"], case, [range(p, n) for p, n in zip(prefix, lens)])
    _assert_only_owned_changed(before, case["cache"], owned)
    for name in ("k_codes", "v_codes"):        # and every owned code byte was written
        written = case["cache"].tensors()[name].cpu()[owned[name]]
        assert written.numel() > 0

