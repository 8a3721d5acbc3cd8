"""perf/split_sweep_graph.py's plan strings (CPU): what each one asks cute.decode for, and a
typed error naming the argument for a malformed one."""

import pytest
from perf_scripts import load


def test_plan_strings():
    mod = load("split_sweep_graph.py")
    assert mod.plan_kwargs("auto", 4) == {}
    assert mod.plan_kwargs("8:16:mc", 4) == {"warps": 8, "num_splits": 16, "merge_ctas": True,
                                             "ring4": False}
    assert mod.plan_kwargs("8:16", 4) == {"warps": 8, "num_splits": 16, "merge_ctas": False,
                                          "ring4": False}
    assert mod.plan_kwargs("8:16:r4", 4) == {"warps": 8, "num_splits": 16, "merge_ctas": False,
                                             "ring4": True}
    assert mod.plan_kwargs("4:32:r4", 4) == {"warps": 4, "num_splits": 32, "ring4": True}
    # GQA 8 has neither the merge-CTA nor the ring-4 pair build, head_dim 64 no ring-4 build:
    # nothing forced
    assert mod.plan_kwargs("8:16", 8) == {"warps": 8, "num_splits": 16}
    assert mod.plan_kwargs("4:128", 4, 64) == {"warps": 4, "num_splits": 128}
    with pytest.raises(ValueError, match="plan: ':r4' needs GQA <= 4 and head_dim 128"):
        mod.plan_kwargs("4:8:r4", 8)


@pytest.mark.parametrize("bad", ["8", "8:x", "8:16:mcx", "8:16:mc:1", ":16", "", "8:16:r4:r4"])
def test_malformed_plan_names_the_argument(bad):
    mod = load("split_sweep_graph.py")
    with pytest.raises(ValueError, match="plan: expected") as e:
        mod.plan_kwargs(bad, 4)
    assert repr(bad) in str(e.value)
