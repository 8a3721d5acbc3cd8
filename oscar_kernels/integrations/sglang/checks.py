"""What the INT2 plugin rejects at startup, with the reason: SGLang server arguments it
does not support (checked by the ``ServerArgs.resolve_once`` hook, before any model is
loaded) and models the INT2 cache cannot hold (checked when the pool is built)."""

from __future__ import annotations

from ...errors import UnsupportedConfigError
from ...spec import is_power_of_two


def check_server_args(server_args) -> None:
    """Reject what the INT2 plugin does not support, before any model is loaded."""
    problems = []
    if int(getattr(server_args, "pp_size", 1) or 1) > 1:
        problems.append(f"pipeline parallelism (--pp-size {server_args.pp_size}): use "
                        "--tp only")
    if getattr(server_args, "enable_hierarchical_cache", False):
        problems.append("--enable-hierarchical-cache: the host tier would copy INT2 pages "
                        "without the per-request BF16 windows")
    if getattr(server_args, "speculative_algorithm", None):
        problems.append(f"speculative decoding ({server_args.speculative_algorithm}): "
                        "draft/verify attention is not implemented")
    if int(getattr(server_args, "dp_size", 1) or 1) > 1 and getattr(
            server_args, "enable_dp_attention", False):
        problems.append("DP attention")
    if problems:
        raise UnsupportedConfigError("--kv-cache-dtype int2 does not support: "
                                     + "; ".join(problems))


def check_model(*, use_mla: bool, head_dim: int, v_head_dim: int | None,
                architecture: str = "") -> None:
    """Reject models the INT2 cache cannot hold, with the reason."""
    if use_mla:
        raise UnsupportedConfigError(f"--kv-cache-dtype int2: MLA models ({architecture}) "
                                     "keep a latent cache, not per-head K/V; not supported")
    if not (is_power_of_two(head_dim) and head_dim >= 16):
        raise UnsupportedConfigError(f"--kv-cache-dtype int2: head_dim must be a power of two "
                                     f">= 16 (Hadamard rotation, 4-way packing), got {head_dim}")
    if v_head_dim not in (None, head_dim):
        raise UnsupportedConfigError(f"--kv-cache-dtype int2: v_head_dim ({v_head_dim}) must "
                                     f"equal head_dim ({head_dim})")
