"""Every public op and wrapper runs with all tensors on a non-zero device (cuda:1) and
matches the same computation on cuda:0: no op assumes the current or the first device.
Needs 2 GPUs (skipped with the reason otherwise)."""

import pytest
import torch

from helpers import i32, make_page_table, poisoned_cache, random_rotation
from oscar_kernels import CacheSpec, ops
from oscar_kernels.integrations import flashinfer as fi

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2,
                       reason=f"needs 2 GPUs to pin tensors to cuda:1, found "
                              f"{torch.cuda.device_count()}"),
]


def _run_all(dev, gen_seed, backend):
    gen = torch.Generator().manual_seed(gen_seed)
    spec = CacheSpec(num_kv_heads=8, head_dim=128, page_size=16)
    lens = [1, 300, 777]
    ip, ix, last, num_pages = make_page_table(lens, 16, gen)
    rot = random_rotation(8, 128, gen)
    cache = poisoned_cache(spec, num_pages, 3, device=dev)
    nnz = sum(lens)
    k = torch.randn(nnz, 8, 128, generator=gen).to(torch.bfloat16).to(dev)
    v = torch.randn(nnz, 8, 128, generator=gen).to(torch.bfloat16).to(dev)
    q = torch.randn(nnz, 32, 128, generator=gen).to(torch.bfloat16).to(dev)
    ip, ix, last, slots = (t.to(dev) for t in (ip, ix, last, i32([2, 0, 1])))
    rot = rot.to(dev)
    ap = i32([0] + torch.cumsum(torch.tensor(lens), 0).tolist()).to(dev)
    seq_lens = fi.get_seq_lens(ip, last, 16)
    b, p = fi.get_batch_indices_positions(ap, seq_lens, nnz)
    assert b.device == dev and p.device == dev
    out = {}
    out["extend"] = ops.paged_extend_attention(q, k, v, ap, cache, ip, ix, last, slots, rot,
                                               backend=backend)
    cache2 = poisoned_cache(spec, num_pages, 3, device=dev)
    fi.append_paged_kv_cache(k, v, b, p, cache2, ix, ip, last, window_slots=slots,
                             rotation=rot, backend=backend)
    qd = q[:3].contiguous()
    out["decode"] = ops.paged_decode_attention(qd, cache2, ip, ix, last, slots, rot,
                                               backend=backend)
    w = fi.Int2BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device=dev), backend=backend)
    w.plan(ip, ix, last, 32, 8, 128, 16, window_slots=slots, rotation=rot)
    out["decode_wrapper"] = w.run(qd, cache2)
    cache3 = poisoned_cache(spec, num_pages, 3, device=dev)
    pw = fi.Int2BatchPrefillWithPagedKVCacheWrapper(torch.empty(1, device=dev), backend=backend)
    pw.plan(ap, ip, ix, last, 32, 8, 128, 16, window_slots=slots, rotation=rot)
    out["prefill_wrapper"] = pw.run(q, k, v, cache3)
    ob, op_ = ops.get_batch_indices_positions(ap, seq_lens, nnz)
    assert ob.device == dev and torch.equal(ob, b) and torch.equal(op_, p)
    cache4 = poisoned_cache(spec, num_pages, 3, device=dev)
    ops.quantize_append_paged_kv_cache(k, v, b, p, cache4, ix, ip, last, slots, rot,
                                       backend=backend)
    for c in (cache2, cache3, cache4):
        for name, t in c.tensors().items():
            assert t.device == dev, name
    for name in ("k_codes", "v_codes"):
        assert torch.equal(getattr(cache4, name), getattr(cache2, name))
    assert all(t.device == dev for t in out.values())
    return {n: t.cpu() for n, t in out.items()}


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_every_public_op_runs_on_cuda1(backend):
    with torch.cuda.device(0):  # the current device stays 0 while the tensors live on 1
        on1 = _run_all(torch.device("cuda", 1), 7, backend)
        on0 = _run_all(torch.device("cuda", 0), 7, backend)
    for name in on0:
        assert torch.equal(on1[name], on0[name]), name
