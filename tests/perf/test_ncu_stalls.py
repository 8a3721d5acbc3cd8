"""perf/ncu_stalls.py on a hand-written Nsight Compute source-page CSV (no GPU, no ncu)."""

import random

from perf_scripts import load

REASONS = ["barrier", "long_sb", "math", "not_selected", "selected", "wait"]


def _csv(rows):
    head = ['"Kernel Name","k",', '"Address","Source","Warp Stall Sampling (All Samples)",'
            '"Instructions Executed",' + ",".join(f'"stall_{r}"' for r in REASONS)]
    body = []
    for addr, sass, executed, stalls in rows:
        body.append(",".join(f'"{x}"' for x in [addr, f"      {sass}", sum(stalls.values()),
                                                  f"{executed:,}"]
                             + [stalls.get(r, 0) for r in REASONS]))
    return "\n".join(head + body) + "\n"


def test_hot_loop_and_reasons(tmp_path, capsys, monkeypatch):
    rng = random.Random()
    peak = rng.randrange(10_000, 20_000)
    loop = [(f"0x{0x100 + 16 * k:x}", f"IMMA.16832.U8.S8 R{k}", peak,
             {"wait": rng.randrange(1, 50), "math": rng.randrange(1, 50)}) for k in range(6)]
    cold = [("0x10", "LDC R1, c[0x0][0x28]", peak // 100, {"long_sb": 500}),
            ("0x900", "EXIT", 3, {"barrier": 7})]
    path = tmp_path / "k_sass.csv"
    path.write_text(_csv(cold[:1] + loop + cold[1:]))
    mod = load("ncu_stalls.py")
    rows = mod.load(str(path))
    assert len(rows) == 8
    assert rows[1]["executed"] == peak and rows[1]["sass"].startswith("IMMA")
    assert rows[0]["long_sb"] == 500 and rows[0]["samples"] == 500
    monkeypatch.setattr("sys.argv", ["ncu_stalls.py", str(path), "--top", "3"])
    mod.main()
    out = capsys.readouterr().out
    wait = sum(s["wait"] for *_, s in loop)
    math = sum(s["math"] for *_, s in loop)
    tot = wait + math
    hot = [ln for ln in out.splitlines() if ln.strip().startswith("hot")][0]
    assert "6 instr" in hot and f"{tot} samples" in hot
    assert f"wait {wait / tot * 100:.1f}%" in hot and f"math {math / tot * 100:.1f}%" in hot
    assert "long_sb" not in hot and "barrier" not in hot     # the cold rows are not hot
    kernel = [ln for ln in out.splitlines() if ln.strip().startswith("kernel")][0]
    assert f"{tot + 507} samples" in kernel
    top = [ln for ln in out.splitlines() if "IMMA" in ln]
    assert len(top) == 3
    best = max(loop, key=lambda r: sum(r[3].values()))
    assert best[0][-3:] in top[0]
