"""perf/trace_decode.py helpers that run without a GPU (the timeline itself needs an H100/H200
and a bundle built with ``aot build --debug trace``)."""

import pytest
import torch
from perf_scripts import load


def _module():
    return load("trace_decode.py")


def test_stats_are_order_statistics():
    mod = _module()
    x = torch.randperm(101).double()           # 0 .. 100 shuffled
    s = mod._stats(x)
    assert (s["min"], s["med"], s["p90"], s["max"]) == (0.0, 50.0, 90.0, 100.0)
    assert mod._stats(torch.empty(0)) == {}


def test_importing_does_not_switch_the_trace_allocation_on():
    from oscar_kernels.cute import bundle
    _module()
    assert "trace" not in bundle.debug_flags()      # the shipped bundle is no trace build


def test_trace_offset_leaves_room_for_the_tickets():
    from oscar_kernels.cute import config
    # tickets are int32 per (sequence, KV head); the trace slots start past 65536 of them
    assert config.TRACE_OFFSET % 64 == 0 and config.TRACE_OFFSET // 4 >= 65536


@pytest.mark.parametrize("argv", [["--help"]])
def test_cli_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _module().main(argv)
    assert e.value.code == 0
    assert "globaltimer" in capsys.readouterr().out


@pytest.mark.parametrize("script", ["attn_parts.py", "bench_case_compare.py",
                                    "graph_capture_probe.py"])
def test_gpu_probe_scripts_parse_their_arguments_without_a_gpu(script, capsys):
    """The probe scripts import torch/CUDA only after parsing: --help works on CPU."""
    mod = load(script)
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_sm_idle_counts_each_sms_last_end():
    mod = _module()
    # SM 0: CTAs ending at 10 and 30; SM 2: 20 and 40 (the last); SM 1 ran nothing
    end = torch.tensor([10.0, 30.0, 20.0, 40.0, float("nan")], dtype=torch.float64)
    sm = torch.tensor([0, 0, 2, 2, 2])
    s = mod.sm_idle(end, sm)
    assert (s["min"], s["max"]) == (0.0, 10.0)
    assert abs(s["idle_fraction"] - 5.0 / 40.0) < 1e-12


def test_trace_warp_slots_fit_between_the_cta_slots_and_the_buffer_end():
    from oscar_kernels.cute import config
    # CTA slots: 128 B each from TRACE_OFFSET; warp slots: 16 B each from TRACE_WARP_OFFSET
    # past it; the host allocates TRACE_OFFSET + 16 MiB in trace mode
    assert config.TRACE_TICKET_WORDS * 4 == config.TRACE_OFFSET + (16 << 20)
    assert config.TRACE_WARP_OFFSET % 16 == 0
    assert config.TRACE_WARP_OFFSET // 128 >= 65536          # CTAs before the warp slots
    assert (16 << 20) - config.TRACE_WARP_OFFSET >= 16 * 8 * 32768   # 32768 CTAs of 8 warps


def test_dispatch_rank_follows_the_grid_order():
    mod = _module()
    # split-major (wide, <= 8 splits): L = h + H (b + B s); 2 heads, 3 sequences, 2 splits
    r = mod._dispatch_rank(3, 2, 2, 8, 4, 8).view(3, 2, 2)
    assert r[0, 0, 0] == 0 and r[1, 1, 0] == 0 and r[2, 0, 0] == 1   # L = 0, 3, 4
    assert r[0, 0, 1] == 1 and r[2, 1, 1] == 2                         # L = 6, 11
    # otherwise split-fastest: L = s + S (h + H b)
    r = mod._dispatch_rank(3, 2, 2, 4, 4, 8).view(3, 2, 2)
    assert r[0, 0, 1] == 0 and r[0, 1, 1] == 0 and r[1, 0, 0] == 1    # L = 1, 3, 4


def test_warp_stats_finds_the_slow_warp_and_the_spread():
    mod = _module()
    g = torch.Generator().manual_seed(0)
    busy = 10.0 + torch.rand(6, 4, generator=g, dtype=torch.float64) * 0.01
    busy[:, 3] *= 1.5                           # warp 3 is slower in every CTA
    end = 2.0 + busy
    rank = torch.tensor([0, 0, 0, 1, 1, 1])
    s = mod.warp_stats(end, busy, rank)
    for r in ("0", "1"):
        rel = s["warp busy / CTA median, by rank"][r]
        assert rel[3] > 1.4 and all(abs(x - 1.0) < 0.01 for x in rel[:3])
    assert 4.9 < s["warp end spread in CTA"]["med"] < 5.1
