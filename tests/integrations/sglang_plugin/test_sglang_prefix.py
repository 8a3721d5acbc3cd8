"""oscar_kernels.integrations.sglang.prefix: the prefix-cache cut and the sink-store key (no
SGLang needed)."""

from __future__ import annotations

from oscar_kernels.integrations.sglang.prefix import reusable_prefix_len, sink_key


def test_reusable_prefix_len_and_sink_key():
    kw = dict(sink_size=64, recent_size=256)
    assert reusable_prefix_len(1000, page_size=1, have_sinks=True, **kw) == 744
    assert reusable_prefix_len(1000, page_size=16, have_sinks=True, **kw) == 736
    assert reusable_prefix_len(1000, page_size=16, have_sinks=False, **kw) == 0
    assert reusable_prefix_len(320, page_size=1, have_sinks=True, **kw) == 0
    assert reusable_prefix_len(321, page_size=1, have_sinks=True, **kw) == 65
    a = sink_key(list(range(100)), 64)
    assert a == sink_key(list(range(64)) + [7] * 5, 64)  # only the first 64 count
    assert a != sink_key(list(range(100)), 64, extra=("lora", 1))
    assert sink_key(list(range(10)), 64) is None
