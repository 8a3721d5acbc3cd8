"""transformers integration: emulated teacher-forced scoring == decoding through the
real packed cache, on a tiny random Llama; the emulation's attention == the reference."""

import pytest
import torch

from evalhelpers import tiny_llama
from helpers import random_rotation, rel_err
from oscar_kernels.errors import UnsupportedConfigError
from oscar_kernels.integrations.transformers import (Int2Scheme, OscarCache, attach_scheme,
                                                     banded_window_attention,
                                                     model_fingerprint, use_oscar_attention)
from oscar_kernels.reference.paged import window_rule_attention

transformers = pytest.importorskip("transformers")


def scheme_for(model, gen, **kw):
    fp = model_fingerprint(model.config)
    layers = [random_rotation(fp.num_kv_heads, fp.head_dim, gen, per_head=True)
              for _ in range(fp.num_layers)]
    return Int2Scheme(layers, **kw)


@pytest.mark.parametrize("head_dim,page_size,group_size,prefill", [
    (16, 4, None, 13), (32, 16, 8, 1), (16, 1, 4, 30)])
def test_teacher_forced_emulation_equals_packed_cache_decoding(head_dim, page_size, group_size,
                                                               prefill, gen):
    model = tiny_llama(head_dim=head_dim)
    scheme = scheme_for(model, gen, sink_size=4, recent_size=8, page_size=page_size,
                        group_size=group_size)
    length = 45
    ids = torch.randint(0, 96, (1, length), generator=gen)
    with torch.no_grad():
        plain = model(ids).logits
        with attach_scheme(model, scheme):
            emulated = model(ids).logits
            cache = OscarCache(model.config, scheme, max_batch_size=1, max_cache_len=64)
            steps = [model(ids[:, :prefill], cache=cache, use_cache=True).logits]
            for i in range(prefill, length):
                steps.append(model(ids[:, i:i + 1], cache=cache, use_cache=True).logits)
        packed = torch.cat(steps, dim=1)
    assert cache.get_seq_length() == length
    assert all(layer.cache is not None for layer in cache.layers)
    # the INT2 region is exercised: the emulation is far from the unquantized model...
    int2_effect = (emulated - plain).abs().max().item()
    assert int2_effect > 1e-2
    # ...and equals the packed cache up to float32 summation order (well inside bf16 noise)
    diff = (emulated - packed).abs().max().item()
    assert diff < 1e-3 * max(1.0, plain.abs().max().item()), (diff, int2_effect)
    # the model is left as it was
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(model(ids).logits, plain)


def test_packed_cache_batch_of_two_matches_single_sequences(gen):
    model = tiny_llama(seed=1)
    scheme = scheme_for(model, gen, sink_size=4, recent_size=8, page_size=4)
    ids = torch.randint(0, 96, (2, 30), generator=gen)
    with torch.no_grad(), attach_scheme(model, scheme):
        cache = OscarCache(model.config, scheme, max_batch_size=2, max_cache_len=40)
        out = [model(ids[:, :10], cache=cache, use_cache=True).logits]
        for i in range(10, 30):
            out.append(model(ids[:, i:i + 1], cache=cache, use_cache=True).logits)
        both = torch.cat(out, 1)
        single = torch.cat([model(ids[b:b + 1]).logits for b in range(2)])
    assert (both - single).abs().max().item() < 1e-3


def test_emulation_with_dynamic_cache_equals_single_pass(gen):
    from transformers import DynamicCache

    model = tiny_llama(seed=2)
    scheme = scheme_for(model, gen, sink_size=4, recent_size=8)
    ids = torch.randint(0, 96, (1, 33), generator=gen)
    with torch.no_grad(), attach_scheme(model, scheme):
        full = model(ids).logits
        dc = DynamicCache(config=model.config)
        out = [model(ids[:, :20], cache=dc, use_cache=True).logits]
        for i in range(20, 33):
            out.append(model(ids[:, i:i + 1], cache=dc, use_cache=True).logits)
    assert (torch.cat(out, 1) - full).abs().max().item() < 1e-4


@pytest.mark.parametrize("sink,recent,lo,hi", [(4, 8, 0, 40), (64, 256, 300, 700),
                                               (0, 16, 50, 90), (5, 0, 10, 60)])
def test_banded_attention_equals_reference_window_rule(sink, recent, lo, hi, gen):
    length, h, g, d = hi, 3, 3, 32
    q = torch.randn(hi - lo, h * g, d, generator=gen)
    k_int2, v_int2, k_bf, v_bf = (torch.randn(length, h, d, generator=gen) for _ in range(4))
    pos = torch.arange(lo, hi)
    want, _ = window_rule_attention(q, pos, k_int2, v_int2, k_bf, v_bf, sink, recent, 0.17)
    got = banded_window_attention(q, pos, k_int2, v_int2, k_bf, v_bf, sink, recent, 0.17)
    assert rel_err(got, want) < 1e-5


def test_emulation_reference_and_banded_agree_through_the_model(gen):
    model = tiny_llama(seed=3)
    scheme = scheme_for(model, gen, sink_size=4, recent_size=8, query_chunk=7)
    ref = Int2Scheme(scheme.layers, sink_size=4, recent_size=8, attention="reference")
    ids = torch.randint(0, 96, (1, 40), generator=gen)
    with torch.no_grad():
        with attach_scheme(model, scheme):
            a = model(ids).logits
        with attach_scheme(model, ref):
            b = model(ids).logits
    assert (a - b).abs().max().item() < 1e-4


def test_errors_name_the_argument(gen):
    model = tiny_llama()
    scheme = scheme_for(model, gen, sink_size=4, recent_size=8)
    with pytest.raises(TypeError, match="scheme"):
        OscarCache(model.config, "not a scheme")
    bad = Int2Scheme(scheme.layers[:1], sink_size=4, recent_size=8)
    with pytest.raises(ValueError, match="scheme.layers"):
        OscarCache(model.config, bad)
    with pytest.raises(ValueError, match="attention"):
        Int2Scheme(scheme.layers, attention="fast")
    ids = torch.randint(0, 96, (1, 12), generator=gen)
    with pytest.raises(UnsupportedConfigError, match="no scheme"):
        with use_oscar_attention(model), torch.no_grad():
            model(ids)
    with torch.no_grad(), attach_scheme(model, scheme):
        cache = OscarCache(model.config, scheme, max_cache_len=8)
        with pytest.raises(ValueError, match="max_cache_len"):
            model(ids, cache=cache, use_cache=True)
