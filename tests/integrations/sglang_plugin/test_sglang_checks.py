"""oscar_kernels.integrations.sglang.checks: unsupported server arguments and models are
rejected with the reason (no SGLang needed)."""

from __future__ import annotations

import pytest

from oscar_kernels import UnsupportedConfigError
from oscar_kernels.integrations.sglang.checks import check_model, check_server_args


def test_plugin_rejects_unsupported_configs():
    class Args:
        pp_size, enable_hierarchical_cache, speculative_algorithm, dp_size = 2, True, None, 1

    with pytest.raises(UnsupportedConfigError, match="pipeline parallelism.*hierarchical"):
        check_server_args(Args())
    with pytest.raises(UnsupportedConfigError, match="MLA"):
        check_model(use_mla=True, head_dim=128, v_head_dim=128,
                           architecture="DeepseekV3ForCausalLM")
    with pytest.raises(UnsupportedConfigError, match="power of two"):
        check_model(use_mla=False, head_dim=80, v_head_dim=80)
    check_model(use_mla=False, head_dim=128, v_head_dim=None)
