"""perf/floor.py helpers and the roofline plot that draws its pure-read line (no GPU)."""

import pytest
from perf_scripts import load


def test_floor_targets_and_stream_sweep():
    mod = load("floor.py")
    row = {"int2_bytes": 4.0e8, "batch": 8, "context": 65536, "fi_ms": 0.5}
    t = mod.targets(row, 4.0)
    assert abs(t["t80_us"] - 125.0) < 1e-9 and t["fi_factor"] == 5 and t["tfi_us"] == 100.0
    assert mod.targets(dict(row, batch=1), 4.0)["fi_factor"] == 3
    assert "fi_factor" not in mod.targets(dict(row, context=32768), 4.0)
    # every config reads at least one block per program; tiny reads still get one config
    for nbytes in (1000, 700_000, 10**9):
        cfgs = mod.stream_configs(nbytes, 132)
        assert cfgs and all(p * b <= max(nbytes // 4, b) for p, b, _ in cfgs)


def test_roofline_plot_draws_the_pure_read_line(tmp_path):
    """cute_bench.py --plot with --floor: one panel per (model, batch), the floor rows drawn."""
    pytest.importorskip("matplotlib")
    import json

    plot_roofline = load("cute_bench.py").plot_roofline

    rows = [dict(preset="qwen3-8b", batch=8, context=c, cute_ms=0.1 * c / 32768,
                 cute_TBps=1.5 + c / 65536, fi_TBps=4.0) for c in (32768, 65536)]
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps({"read_bandwidth": {"read_TBps": 4.4}, "rows": rows}))
    floor = tmp_path / "f.json"
    floor.write_text(json.dumps({"rows": [dict(preset="qwen3-8b", batch=8, context=c,
                                               int2_MB=100.0, stream_us=30.0)
                                          for c in (32768, 65536)]}))
    png = tmp_path / "r.png"
    plot_roofline(str(bench), str(png), str(floor))
    assert png.stat().st_size > 1000
