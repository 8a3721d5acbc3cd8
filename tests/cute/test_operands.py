"""The operands of the CuTe decode kernel (:mod:`oscar_kernels.cute.operands`): the rotations
in MMA-fragment order, and the code encodings checked bit-exactly on the CPU against the
packed format of :func:`oscar_kernels.reference.quant.pack_codes`.

The kernel itself runs only on sm_90 (``test_cute_gpu.py``); these tests pin the integer
and floating-point identities its unpack relies on (see the module docstring of
``oscar_kernels/cute/decode_sm90.py``), so that a change of the format or of a mask
constant fails here first:

* fp16 operands: ``w & mask_i`` read as an fp16 pair is ``4^i * code * 2^-24`` (a subnormal),
  for the even bytes of a 32-bit word and, after ``>> 8``, for the odd ones;
* int8 QK (head_dim 128): ``(w * 4^(3-i)) & 0xC0C0C0C0`` is ``64 * code`` of quarter ``i`` in
  every byte, and the query split ``q' ~ a (hi + lo / 256)`` keeps the score error below
  ``D * 3 * max|q'| / 65024`` (the bound the docstring states), with ``256 * S_hi + S_lo``
  inside int32;
* the same QK on unmasked operands ``w * 4^(3-i) mod 2^32``, all four quarters or all but
  quarter 3 (the forms of ``k_operand_form``): with the query of
  :func:`oscar_kernels.cute.operands.unmasked_k_query` the dot products equal ``64 * q' . codes``
  exactly, and after the int8 split the error stays below ``D * 255 / 64 * max|Q| / 65024``
  with ``256 * S_hi + S_lo`` inside int32.
"""

from __future__ import annotations

import pytest
import torch

from oscar_kernels.cute import operands
from oscar_kernels.cute.operands import unmasked_k_query
from oscar_kernels.reference.quant import pack_codes

QUARTER_MASK = (0x00030003, 0x000C000C, 0x00300030, 0x00C000C0)


def _words(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4 k]`` -> little-endian uint32 words ``[..., k]`` (as int64)."""
    b = packed.to(torch.int64).reshape(*packed.shape[:-1], -1, 4)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _fp16_pair(word: torch.Tensor) -> torch.Tensor:
    """uint32 words -> their two fp16 halves as float64, ``[..., 2]`` (low half first)."""
    halves = torch.stack([word & 0xFFFF, word >> 16], dim=-1).to(torch.int16)
    return halves.view(torch.float16).to(torch.float64)


@pytest.mark.parametrize("d", [64, 128])
def test_fp16_subnormal_operands_are_exact(d):
    g = torch.Generator().manual_seed(d)
    codes = torch.randint(0, 4, (32, d), generator=g, dtype=torch.uint8)
    words = _words(pack_codes(codes))                       # [32, d / 16]
    q4 = d // 4
    for i, mask in enumerate(QUARTER_MASK):
        for shift in (0, 8):                                # even bytes, odd bytes
            got = _fp16_pair((words >> shift) & mask)       # [32, d / 16, 2]
            # word w holds bytes 4w .. 4w + 3; the halves take bytes 4w + shift/8 and
            # 4w + 2 + shift/8, and byte j carries channel j + i * D/4 of quarter i
            j0 = torch.arange(d // 16) * 4 + shift // 8
            want = torch.stack([codes[:, j0 + i * q4], codes[:, j0 + 2 + i * q4]], dim=-1)
            assert torch.equal(got, want.to(torch.float64) * (4 ** i) * 2.0 ** -24)
    # products with any fp16 query value are exact in float32 (what the MMA accumulates)
    q = torch.randn(4096, generator=g).to(torch.float16).to(torch.float64)
    sub = torch.tensor([c * 4 ** i * 2.0 ** -24 for i in range(4) for c in range(4)],
                       dtype=torch.float64)
    prod = q[:, None] * sub[None, :]
    assert torch.equal(prod.to(torch.float32).to(torch.float64), prod)


def test_int8_quarter_fields():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 4, (64, 128), generator=g, dtype=torch.uint8)
    words = _words(pack_codes(codes))                       # [64, 8]
    for i in range(4):
        x = ((words * 4 ** (3 - i)) & 0xFFFFFFFF) & 0xC0C0C0C0
        got = torch.stack([(x >> (8 * b)) & 0xFF for b in range(4)], dim=-1)  # [64, 8, 4]
        want = codes[:, i * 32:(i + 1) * 32].reshape(64, 8, 4).to(torch.int64) * 64
        assert torch.equal(got, want)


def _split_query(q: torch.Tensor):
    """The kernel's int8 split of one head's q' (float32 in, as the kernel computes it)."""
    mx = q.abs().max()
    inv = torch.where(mx > 0, 127.0 / mx, torch.zeros_like(mx))
    hi = torch.round(q * inv)                               # cvt.rni: nearest even
    lo = torch.clamp(torch.round((q * inv - hi) * 256.0), -127, 127)
    return hi.to(torch.int64), lo.to(torch.int64), mx


@pytest.mark.parametrize("outlier", [1.0, 30.0])
def test_int8_query_split_error_bound(outlier):
    g = torch.Generator().manual_seed(int(outlier))
    d = 128
    for _ in range(50):
        q = torch.randn(d, generator=g)
        q[torch.randint(0, d, (3,), generator=g)] *= outlier      # a few large channels
        q = q.to(torch.bfloat16).to(torch.float32)                # q' is staged as bf16
        codes = torch.randint(0, 4, (16, d), generator=g).to(torch.int64)
        hi, lo, mx = _split_query(q)
        assert int(hi.abs().max()) <= 127 and int(lo.abs().max()) <= 127
        s_hi = (64 * codes * hi).sum(-1)
        s_lo = (64 * codes * lo).sum(-1)
        s = 256 * s_hi + s_lo
        assert int(s.abs().max()) < 2 ** 30
        got = s.to(torch.float64) * float(mx) / (127.0 * 64 * 256)
        want = (codes.to(torch.float64) * q.to(torch.float64)).sum(-1)
        bound = d * 3 * float(mx) / 65024 * (1 + 1e-6)
        assert float((got - want).abs().max()) <= bound


def test_int8_split_of_a_zero_head_is_zero():
    hi, lo, mx = _split_query(torch.zeros(128))
    assert float(mx) == 0.0 and int(hi.abs().sum()) == 0 and int(lo.abs().sum()) == 0


def _unmasked_operands(words: torch.Tensor, top: bool = False) -> torch.Tensor:
    """uint32 words ``[..., k]`` -> the kernel's unmasked u8 A operands ``[..., k, 4 (i), 4
    (byte j)]``: byte ``j`` of ``w * 4^(3 - i) mod 2^32`` (``top``: quarter 3 masked)."""
    u = torch.stack([(words * 4 ** (3 - i)) & 0xFFFFFFFF for i in range(4)], dim=-1)
    if top:
        u[..., 3] &= 0xC0C0C0C0
    return torch.stack([(u >> (8 * j)) & 0xFF for j in range(4)], dim=-1)


def _query_words(q: torch.Tensor, top: bool = False) -> list:
    """``q [128]`` -> per code word ``w`` the 4 x 4 ``[quarter i][byte j]`` query elements
    (channel ``4 w + j + 32 i``), transformed by :func:`unmasked_k_query`."""
    return [unmasked_k_query([[q[4 * w + j + 32 * i] for j in range(4)] for i in range(4)],
                             top) for w in range(8)]


def _unmasked_dot(ops: torch.Tensor, qt: list) -> torch.Tensor:
    """``sum_{w, i, j} Q_w[i][j] * byte_j(u_i(word w))`` for operands ``[n, 8, 4, 4]``."""
    qm = torch.stack([torch.stack([torch.stack(list(r)) for r in qw]) for qw in qt])
    return (ops * qm).sum(dim=(-1, -2, -3))


@pytest.mark.parametrize("top", [False, True])
def test_unmasked_k_operands_are_cancelled_exactly(top):
    # every byte value in every position of a word (word 0 of rows 0-255), the other words
    # random, against random queries: the transformed query makes the unmasked products 64 x
    # the true dot product, exactly
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 4, (512, 128), generator=g, dtype=torch.uint8)
    quarters = 2 * torch.arange(4)
    for j in range(4):                                           # byte j = channels j + 32 i
        byte = (torch.arange(256) + 67 * j) % 256
        codes[:256].view(256, 4, 32)[:, :, j] = (byte.view(256, 1) >> quarters) & 3
    words = _words(pack_codes(codes))
    for j in range(4):
        assert sorted(((words[:256, 0] >> (8 * j)) & 0xFF).tolist()) == list(range(256))
    ops = _unmasked_operands(words, top)                         # [512, 8, 4, 4]
    assert int(ops.max()) == 255                                 # the other bits are there
    for _ in range(20):
        q = torch.randn(128, generator=g, dtype=torch.float64)
        q = q.to(torch.bfloat16).to(torch.float64)               # q' is staged as bf16
        got = _unmasked_dot(ops.to(torch.float64), _query_words(q, top))
        want = 64 * (codes.to(torch.float64) * q).sum(-1)
        assert torch.equal(got, want)


@pytest.mark.parametrize("top", [False, True])
@pytest.mark.parametrize("outlier", [1.0, 30.0])
def test_unmasked_k_int8_split_error_bound(outlier, top):
    g = torch.Generator().manual_seed(100 + int(outlier))
    d = 128
    for _ in range(50):
        q = torch.randn(d, generator=g)
        q[torch.randint(0, d, (3,), generator=g)] *= outlier
        q = q.to(torch.bfloat16).to(torch.float32)
        qt = _query_words(q, top)                                # float32, as the kernel
        qflat = torch.stack([torch.stack([torch.stack(list(r)) for r in qw]) for qw in qt])
        hi, lo, mx = _split_query(qflat)                         # [8, 4, 4], max over the head
        assert float(mx) <= 1.5 * float(q.abs().max())           # the transform grows < 1.5x
        codes = torch.randint(0, 4, (16, d), generator=g, dtype=torch.uint8)
        ops = _unmasked_operands(_words(pack_codes(codes)), top)  # [16, 8, 4, 4]
        s_hi = (ops * hi).sum(dim=(-1, -2, -3))
        s_lo = (ops * lo).sum(dim=(-1, -2, -3))
        s = 256 * s_hi + s_lo
        assert int(s.abs().max()) < 2 ** 30
        got = s.to(torch.float64) * float(mx) / (127.0 * 64 * 256)
        want = (codes.to(torch.float64) * q.to(torch.float64)).sum(-1)
        bound = d * 255 / 64 * float(mx) / 65024 * (1 + 1e-3)
        assert float((got - want).abs().max()) <= bound


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
    frag, stride = operands.mma_operand(rot, transpose)
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
    assert operands.mma_operand(rot, transpose)[0] is frag
    base.mul_(-1.0)
    rot = base.expand(h, d, d) if shared else base
    frag2, _ = operands.mma_operand(rot, transpose)
    assert torch.equal(frag2.view(torch.float16), -frag.view(torch.float16))
