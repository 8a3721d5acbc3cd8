"""Streaming second-moment statistics of post-RoPE Q, K, V per layer and KV head.

Everything accumulates in float64 as running sums, so memory is fixed by the model's
shape (five ``[H, D, D]`` matrices per layer) and never grows with the number of
calibration tokens; chunks can arrive in any order and any size.

Targets, per KV head ``h`` with query group ``G = num_qo_heads / num_kv_heads``
(``N`` tokens; ``q_{t,j}`` is query head ``j`` of the group at token ``t``):

- ``C_Q = 1/(N G) Σ_t Σ_j q_{t,j}ᵀ q_{t,j}`` — what the key rotation protects:
  the score error of a key error ``δk`` is ``q·δk``, with mean square ``δk C_Q δkᵀ``;
- ``C_K = KᵀK / N`` and ``C_V = VᵀV / N`` — the raw ("kv-cov") baselines;
- ``C_S = 1/(N G) Σ_j Vᵀ S_jᵀ S_j V`` (exact): ``S_j`` is query head ``j``'s causal
  softmax matrix, so ``Vᵀ S_jᵀ S_j V = Σ_i o_{ij}ᵀ o_{ij}`` with ``o_{ij} = S_{j,i} V``
  the attention output of query ``i``. It is accumulated from the model's real attention
  output, which is computed blockwise by the model's own kernel and never materializes
  ``S``; :func:`score_weighted_covariance` is the blockwise form for given ``q, k, v``;
- ``C_S`` (proxy, the published reference's cheaper form): ``Vᵀ diag(w) V / N`` with
  ``w_t = k_t C_Q k_tᵀ`` normalized to mean 1. In one streaming pass ``C_Q`` is the
  running estimate including the current chunk (the first chunk weights itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import expect

STAT_NAMES = ("c_q", "c_k", "c_v", "c_s", "c_s_proxy")


class LayerStats:
    """Running sums for one attention layer, per KV head (float64, CPU).

    Parameters
    ----------
    num_kv_heads, num_qo_heads, head_dim : int
    """

    def __init__(self, num_kv_heads: int, num_qo_heads: int, head_dim: int):
        expect(num_qo_heads % num_kv_heads == 0, "num_qo_heads",
               f"a multiple of num_kv_heads={num_kv_heads}", num_qo_heads)
        self.num_kv_heads = num_kv_heads
        self.num_qo_heads = num_qo_heads
        self.head_dim = head_dim
        z = lambda: torch.zeros(num_kv_heads, head_dim, head_dim, dtype=torch.float64)  # noqa: E731
        self.sum_qq = z()
        self.sum_kk = z()
        self.sum_vv = z()
        self.sum_oo = z()
        self.sum_wvv = z()
        self.sum_w = torch.zeros(num_kv_heads, dtype=torch.float64)
        self.num_tokens = 0

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    def update(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               o: torch.Tensor | None = None) -> None:
        """Add one chunk of ``T`` tokens.

        Parameters
        ----------
        q : torch.Tensor
            ``[T, num_qo_heads, head_dim]`` post-RoPE queries.
        k, v : torch.Tensor
            ``[T, num_kv_heads, head_dim]`` post-RoPE keys and values.
        o : torch.Tensor, optional
            ``[T, num_qo_heads, head_dim]`` attention output of the same chunk (per head,
            before ``o_proj``); needed for the exact ``C_S``.
        """
        t, h, g, d = q.shape[0], self.num_kv_heads, self.group, self.head_dim
        expect(q.shape == (t, h * g, d), "q", f"[T, {h * g}, {d}]", q)
        expect(k.shape == (t, h, d), "k", f"[{t}, {h}, {d}]", k)
        expect(v.shape == (t, h, d), "v", f"[{t}, {h}, {d}]", v)
        q64 = q.to(torch.float64).reshape(t, h, g, d)
        k64 = k.to(torch.float64)
        v64 = v.to(torch.float64)
        self.sum_qq += torch.einsum("thgd,thge->hde", q64, q64)
        self.sum_kk += torch.einsum("thd,the->hde", k64, k64)
        self.sum_vv += torch.einsum("thd,the->hde", v64, v64)
        if o is not None:
            expect(o.shape == (t, h * g, d), "o", f"[{t}, {h * g}, {d}]", o)
            o64 = o.to(torch.float64).reshape(t, h, g, d)
            self.sum_oo += torch.einsum("thgd,thge->hde", o64, o64)
        self.num_tokens += t
        c_q = self.sum_qq / (self.num_tokens * g)                     # running estimate
        w = torch.einsum("thd,hde,the->th", k64, c_q, k64)            # [T, H]
        self.sum_wvv += torch.einsum("th,thd,the->hde", w, v64, v64)
        self.sum_w += w.sum(dim=0)

    def covariances(self, *, per_head: bool = True) -> dict[str, torch.Tensor]:
        """Means ``{"c_q", "c_k", "c_v", "c_s", "c_s_proxy"}``, each ``[Hr, D, D]`` float64
        (``Hr = num_kv_heads`` when ``per_head`` else 1: the mean over KV heads)."""
        expect(self.num_tokens > 0, "LayerStats", "at least one update", self.num_tokens)
        n, g = self.num_tokens, self.group
        out = {
            "c_q": self.sum_qq / (n * g),
            "c_k": self.sum_kk / n,
            "c_v": self.sum_vv / n,
            "c_s": self.sum_oo / (n * g),
            "c_s_proxy": self.sum_wvv / self.sum_w.clamp_min(1e-300)[:, None, None],
        }
        if not per_head:
            out = {k: v.mean(dim=0, keepdim=True) for k, v in out.items()}
        return out

    def state_dict(self) -> dict:
        return {"sum_qq": self.sum_qq, "sum_kk": self.sum_kk, "sum_vv": self.sum_vv,
                "sum_oo": self.sum_oo, "sum_wvv": self.sum_wvv, "sum_w": self.sum_w,
                "num_tokens": self.num_tokens}


def score_weighted_covariance(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              scaling: float, *, block_size: int = 256) -> torch.Tensor:
    """Exact ``Σ_j Vᵀ S_jᵀ S_j V`` of one causal sequence, blockwise over queries.

    Parameters
    ----------
    q : torch.Tensor
        ``[T, num_qo_heads, head_dim]``.
    k, v : torch.Tensor
        ``[T, num_kv_heads, head_dim]``.
    scaling : float
        Softmax scale of the scores.
    block_size : int, keyword-only
        Queries per block: the largest score tile held is ``[block_size, Hq, T]``.

    Returns
    -------
    torch.Tensor
        ``[num_kv_heads, head_dim, head_dim]`` float64: the sum (not mean) over the group's
        query heads and the ``T`` queries of ``(S_i V)ᵀ (S_i V)``.
    """
    t, hq, d = q.shape
    h = k.shape[1]
    g = hq // h
    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    kr = k64.repeat_interleave(g, dim=1)
    vr = v64.repeat_interleave(g, dim=1)
    out = torch.zeros(h, d, d, dtype=torch.float64)
    pos = torch.arange(t)
    for s in range(0, t, block_size):
        e = min(t, s + block_size)
        scores = torch.einsum("qhd,lhd->qhl", q64[s:e], kr[:e]) * scaling
        mask = pos[None, :e] > pos[s:e, None]
        probs = torch.softmax(scores.masked_fill(mask[:, None, :], float("-inf")), dim=-1)
        o = torch.einsum("qhl,lhd->qhd", probs, vr[:e]).reshape(e - s, h, g, d)
        out += torch.einsum("qhgd,qhge->hde", o, o)
    return out


@dataclass
class HeldoutSequence:
    """Real post-RoPE tensors of one held-out sequence in one layer (float32, CPU).

    ``q [Nq, Hq, D]`` are the queries at ``q_positions [Nq]`` (a sample of positions),
    ``k, v [L, H, D]`` every key and value of the sequence.
    """

    q: torch.Tensor
    q_positions: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scaling: float
