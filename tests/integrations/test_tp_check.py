"""perf/tp_check.py --simulate: ranks as CPU processes (gloo, reference backend); the
gathered per-rank outputs must equal the single-rank run bit for bit."""

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_tp_check_simulate_two_ranks(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "perf", "tp_check.py"), "--simulate",
           "--world-size", "2", "--models", "llama3-70b", "--lens", "45,12", "--out",
           str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "tp_check_simulated_tp2.json").read_text())
    assert rep["world_size"] == 2 and rep["simulate"] and rep["backend"] == "reference"
    (row,) = rep["models"]
    assert row["model"] == "llama3-70b" and row["kv_heads_per_rank"] == 4
    assert row["o_ext_bit_identical"] and row["o_dec_bit_identical"]
    assert row["o_ext_max_abs_diff"] == 0 and row["o_dec_max_abs_diff"] == 0
    assert "git_commit" in rep["env"]
