"""Every bad input named in the foundation issue gets a typed error naming the argument."""

import pytest
import torch

from helpers import i32, make_page_table, poisoned_cache, random_rotation
from oscar_kernels import CacheSpec, LayerRotation, ops
from oscar_kernels.errors import BackendUnavailableError


@pytest.fixture
def setup(gen):
    spec = CacheSpec(num_kv_heads=2, head_dim=64, page_size=16)
    kv_indptr, kv_indices, kv_last, num_pages = make_page_table([20, 7], 16, gen)
    cache = poisoned_cache(spec, num_pages, 2)
    rot = random_rotation(2, 64, gen)
    return spec, cache, (kv_indptr, kv_indices, kv_last, i32([0, 1])), rot


def _append(cache, table, rot, **over):
    args = dict(append_key=torch.randn(3, 2, 64), append_value=torch.randn(3, 2, 64),
                batch_indices=i32([0, 0, 1]), positions=i32([0, 1, 0]), cache=cache,
                kv_indices=table[1], kv_indptr=table[0], kv_last_page_len=table[2],
                window_slots=table[3], rotation=rot)
    args.update(over)
    ops.quantize_append_paged_kv_cache(**args, backend="reference")


def _decode(cache, table, rot, **over):
    args = dict(q=torch.randn(2, 6, 64), cache=cache, kv_indptr=table[0], kv_indices=table[1],
                kv_last_page_len=table[2], window_slots=table[3], rotation=rot)
    args.update(over)
    return ops.paged_decode_attention(**args, backend="reference")


@pytest.mark.parametrize("over,exc,match", [
    (dict(head_dim=48), ValueError, "head_dim: expected a power of two"),
    (dict(head_dim=64, group_size=48), ValueError, "group_size: expected an int >= 4 dividing"),
    (dict(page_size=0), ValueError, "page_size"),
    (dict(sink_size=-1), ValueError, "sink_size: expected a non-negative"),
    (dict(recent_size=-5), ValueError, "recent_size"),
    (dict(kv_layout="HDN"), ValueError, "kv_layout"),
    (dict(scale_dtype=torch.bfloat16), TypeError, "scale_dtype"),
])
def test_spec_errors(over, exc, match):
    kw = dict(num_kv_heads=2, head_dim=64, page_size=16)
    kw.update(over)
    with pytest.raises(exc, match=match):
        CacheSpec(**kw)


def test_append_dtype_and_shape_errors(setup):
    spec, cache, table, rot = setup
    with pytest.raises(TypeError, match="append_key: expected dtype"):
        _append(cache, table, rot, append_key=torch.randn(3, 2, 64).to(torch.float64))
    with pytest.raises(ValueError, match=r"append_value: expected shape \(3, 2, 64\)"):
        _append(cache, table, rot, append_value=torch.randn(3, 2, 32))
    with pytest.raises(TypeError, match="positions: expected dtype torch.int32"):
        _append(cache, table, rot, positions=torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="batch_indices: expected shape"):
        _append(cache, table, rot, batch_indices=i32([0, 0]))


def test_page_table_errors(setup):
    spec, cache, table, rot = setup
    bad_indices = table[1].clone()
    bad_indices[0] = cache.num_pages + 5
    with pytest.raises(ValueError, match=r"kv_indices: expected page ids in \[0"):
        _decode(cache, (table[0], bad_indices, table[2], table[3]), rot)
    with pytest.raises(ValueError, match="kv_indptr: expected non-decreasing"):
        _decode(cache, (i32([0, 2, 1]), table[1], table[2], table[3]), rot)
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\]"):
        _decode(cache, (i32([0, 2, 9]), table[1], table[2], table[3]), rot)
    with pytest.raises(ValueError, match="kv_last_page_len: expected values in"):
        _decode(cache, (table[0], table[1], i32([17, 7]), table[3]), rot)
    with pytest.raises(ValueError, match="kv_last_page_len: expected values in"):
        _decode(cache, (table[0], table[1], i32([-1, 7]), table[3]), rot)
    with pytest.raises(ValueError, match="window_slots: expected values in"):
        _decode(cache, (table[0], table[1], table[2], i32([0, 9])), rot)
    with pytest.raises(ValueError, match="window_slots: expected distinct"):
        _decode(cache, (table[0], table[1], table[2], i32([1, 1])), rot)


def test_negative_and_out_of_range_positions(setup):
    spec, cache, table, rot = setup
    with pytest.raises(ValueError, match="positions: expected non-negative"):
        _append(cache, table, rot, positions=i32([0, -1, 0]))
    with pytest.raises(ValueError, match="positions: expected values < the sequence length"):
        _append(cache, table, rot, positions=i32([0, 1, 7]))
    with pytest.raises(ValueError, match="positions: expected distinct"):
        _append(cache, table, rot, positions=i32([1, 1, 0]))
    with pytest.raises(ValueError, match="batch_indices: expected values in"):
        _append(cache, table, rot, batch_indices=i32([0, 0, 2]))


def test_decode_q_errors(setup):
    spec, cache, table, rot = setup
    with pytest.raises(ValueError, match="num_qo_heads a multiple"):
        _decode(cache, table, rot, q=torch.randn(2, 5, 64))
    with pytest.raises(ValueError, match=r"q: expected shape \(2, 6, 64\)"):
        _decode(cache, table, rot, q=torch.randn(3, 6, 64))
    with pytest.raises(TypeError, match="q: expected dtype"):
        _decode(cache, table, rot, q=torch.randint(0, 3, (2, 6, 64)))
    with pytest.raises(TypeError, match="out: expected dtype"):
        _decode(cache, table, rot, out=torch.empty(2, 6, 64, dtype=torch.bfloat16))


def test_decode_length_hint(setup):
    """``max_kv_len`` is a plan hint: typed errors for a non-int or a negative length, the same
    result for any value (the reference ignores it)."""
    spec, cache, table, rot = setup
    for bad in ("20", 20.0, True):
        with pytest.raises(TypeError, match="max_kv_len: expected None or an int"):
            _decode(cache, table, rot, max_kv_len=bad)
    with pytest.raises(ValueError, match="max_kv_len: expected a length >= 0, got -1"):
        _decode(cache, table, rot, max_kv_len=-1)
    # fill the poisoned pages with both sequences (20 and 7 tokens)
    pos = torch.cat([torch.arange(20), torch.arange(7)]).to(torch.int32)
    _append(cache, table, rot, append_key=torch.randn(27, 2, 64),
            append_value=torch.randn(27, 2, 64), positions=pos,
            batch_indices=i32([0] * 20 + [1] * 7))
    q = torch.randn(2, 6, 64)
    want = _decode(cache, table, rot, q=q)
    assert torch.isfinite(want).all()
    for n in (0, 20, 1 << 20):
        assert torch.equal(_decode(cache, table, rot, q=q, max_kv_len=n), want)


def test_rotation_errors(setup):
    spec, cache, table, rot = setup
    with pytest.raises(TypeError, match="rotation: expected a LayerRotation"):
        _decode(cache, table, rot.rot_k)
    with pytest.raises(ValueError, match=r"rotation.rot_k: expected shape \[1 or 2, 64, 64\]"):
        _decode(cache, table, LayerRotation.identity(128))
    with pytest.raises(TypeError, match="rotation.rot_v: expected dtype float32"):
        _decode(cache, table, LayerRotation(rot.rot_k, rot.rot_v.double()))


def test_cache_errors(setup):
    spec, cache, table, rot = setup
    with pytest.raises(TypeError, match="cache: expected an Int2PagedKVCache"):
        _decode(cache.tensors(), table, rot)
    cache.k_params = cache.k_params.float()
    with pytest.raises(TypeError, match="cache.k_params: expected dtype"):
        _decode(cache, table, rot)


def test_extend_errors(setup):
    spec, cache, table, rot = setup
    q = torch.randn(4, 6, 64)
    kv = torch.randn(4, 2, 64)
    with pytest.raises(ValueError, match="qo_indptr: expected offsets from 0 to nnz=4"):
        ops.paged_extend_attention(q, kv, kv, i32([0, 2, 3]), cache, *table, rot,
                                   backend="reference")
    with pytest.raises(ValueError, match="qo_indptr: expected chunk lengths"):
        ops.paged_extend_attention(q, kv, kv, i32([0, 0, 4]), cache, table[0], table[1],
                                   i32([4, 3]), table[3], rot, backend="reference")


def test_unknown_backend(setup):
    spec, cache, table, rot = setup
    with pytest.raises(ValueError, match="backend: expected one of"):
        ops.paged_decode_attention(torch.randn(2, 6, 64), cache, *table, rot, backend="cuda")


def test_cute_backend_unavailable_is_typed(setup):
    spec, cache, table, rot = setup
    with pytest.raises((BackendUnavailableError, NotImplementedError)):
        ops.paged_decode_attention(torch.randn(2, 6, 64), cache, *table, rot, backend="cute")


def test_import_without_triton_or_cutlass():
    import subprocess
    import sys
    code = ("import sys; sys.modules['triton'] = None; sys.modules['cutlass'] = None\n"
            "import oscar_kernels, oscar_kernels.ops, oscar_kernels.rotation\n"
            "print(oscar_kernels.CacheSpec)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_get_batch_indices_positions():
    append_indptr = i32([0, 3, 3, 5])
    seq_lens = i32([10, 4, 2])
    b, p = ops.get_batch_indices_positions(append_indptr, seq_lens, 5)
    assert b.tolist() == [0, 0, 0, 2, 2]
    assert p.tolist() == [7, 8, 9, 0, 1]
    assert b.dtype == torch.int32 and p.dtype == torch.int32


def test_dispatch_runs_backends_on_the_cache_device(monkeypatch):
    """A CUDA backend function runs with the cache's device current (Triton rejects pointers
    of another device; a 2-GPU run with a cache on cuda:1 failed without this). Checked on
    the CPU by recording what ``torch.cuda.device`` is entered with."""
    import contextlib

    from oscar_kernels import ops

    entered = []

    @contextlib.contextmanager
    def fake_device(dev):
        entered.append(dev)
        yield

    monkeypatch.setattr(torch.cuda, "device", fake_device)

    def kernel(x):
        return x + 1

    dev = torch.device("cuda", 1)
    run = ops._on_device(kernel, dev)
    assert run(41) == 42 and entered == [dev]
    assert ops._on_device(kernel, torch.device("cpu")) is kernel
