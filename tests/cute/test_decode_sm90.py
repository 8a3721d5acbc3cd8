"""Host-side models of the decode kernel's index arithmetic
(:mod:`oscar_kernels.cute.decode_sm90`), written again with Python ints: the warps' chunk
ranges and the any-page division."""

from __future__ import annotations

import pytest
import torch

from oscar_kernels.cute import config


def test_any_page_division_is_exact_below_the_limit():
    """The kernel's page lookup: floor(x * rn(1/d)) in float32 plus one correction each way
    (ptx._udiv_rcp) equals x // d for every page size up to 4096 at positions
    spread over [0, ANY_PAGE_MAX_SLOTS) and at the multiples of d around it (numpy model of
    the PTX: cvt.rn.f32.s32, mul.f32 (round to nearest), cvt.rzi.s32.f32)."""
    import numpy as np

    rng = np.random.default_rng(5)
    lim = config.ANY_PAGE_MAX_SLOTS
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
    """The wide build's rank-weighted ranges (Int2PagedDecodeSm90._warp_range, ``self.ranked``),
    written again with Python ints: splits s < c0 weigh w0, the others RANK_WEIGHT; a split's
    units are shared equally by its nw warps; balanced branch only."""
    from oscar_kernels.cute.config import RANK_WEIGHT

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
    from oscar_kernels.cute.config import RANK0_WEIGHT, RANK_WEIGHT

    cost, nw = config.WINDOW_CHUNK_COST, 8
    nsw = splits * nw
    gen = torch.Generator().manual_seed(splits)
    for _ in range(30):
        n_win = int(torch.randint(0, 21, (1,), generator=gen))
        full = n_win // nsw
        lo = max(config.RANK_MIN_CHUNKS, 2 * cost * (full + 1)) * nsw
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
    cost = config.WINDOW_CHUNK_COST
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
