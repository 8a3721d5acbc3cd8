"""Torch stand-in for ``vllm._custom_ops.rotary_embedding`` (the only name SGLang's CPU
path imports). It touches neither attention nor the KV cache.

On this platform SGLang's ``RotaryEmbedding`` dispatches to ``forward_native`` (pure torch),
so this function is normally never called; it is implemented (vLLM's in-place semantics)
rather than left raising so that a dispatch change would still compute the right thing.
"""

import torch


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """In place: rotate ``query`` / ``key`` (``[T, H * head_size]`` or ``[T, H, head_size]``)
    by ``cos_sin_cache[positions]`` (``[max_pos, rot_dim]``: cos half then sin half)."""
    cos_sin = cos_sin_cache.index_select(0, positions.flatten().long())
    rot_dim = cos_sin.shape[-1]
    cos, sin = cos_sin.float().chunk(2, dim=-1)            # [T, rot_dim / 2]

    def rotate(x: torch.Tensor) -> None:
        shape = x.shape
        v = x.view(positions.numel(), -1, head_size)
        r = v[..., :rot_dim].float()
        c, s = cos[:, None, :], sin[:, None, :]
        if is_neox:
            x1, x2 = r.chunk(2, dim=-1)
            out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
        else:
            x1, x2 = r[..., 0::2], r[..., 1::2]
            out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
        v[..., :rot_dim] = out.to(x.dtype)
        assert x.shape == shape

    rotate(query)
    if key is not None:
        rotate(key)
