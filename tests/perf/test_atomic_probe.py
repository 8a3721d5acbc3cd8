"""perf/atomic_probe.py's claim kernel on the Triton interpreter (no GPU): every program's
claims land on its counter, and each program gets the counter values it incremented."""

import pytest
from perf_scripts import load


def test_claim_kernel_counts_every_claim():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    mod = load("atomic_probe.py")
    n, k, rounds = 24, 8, 3
    counters = torch.zeros(k * 32, dtype=torch.int32)
    out = torch.full((n,), -1, dtype=torch.int32)
    mod._claim[(n,)](counters, out, K=k, ROUNDS=rounds, num_warps=1)
    # each counter: n / k programs x rounds claims; nothing written between the counters
    assert counters.view(k, 32)[:, 0].tolist() == [n // k * rounds] * k
    assert int(counters.view(k, 32)[:, 1:].abs().sum()) == 0
    # the interpreter runs programs one after another: program p's claims return the
    # tickets t, t + 1, .., t + rounds - 1 of its counter, t = rounds * (p // k)
    for p in range(n):
        t = rounds * (p // k)
        assert int(out[p]) == rounds * t + rounds * (rounds - 1) // 2
