"""perf/attn_parts.py --stack without a GPU: the control flow of both stacks (INT2 through
the reference backend, BF16 through torch SDPA standing in for FlashInfer) with the CUDA
timers stubbed, so an edit that breaks a case is caught before it costs device time."""

import types

import torch
from perf_scripts import load


def test_stack_runs_every_case_for_both_caches(monkeypatch, capsys):
    ap = load("attn_parts.py")
    import perf.bench_e2e as e2e
    import perf.harness as hz

    timed, sustained = [], []

    def fake_time_cuda(fn, **kw):
        fn()
        timed.append(fn)
        return {"median_ms": 1.0, "mode": "eager"}

    class SdpaStandIn(e2e.Bf16PagedAttention):
        def __init__(self, cfg, **kw):
            super().__init__(cfg, **{**kw, "kernel": "sdpa"})
            self.wrapper = types.SimpleNamespace(
                run=lambda q, kv, out: out.copy_(self._sdpa(q, *kv)))

    monkeypatch.setattr(hz, "time_cuda", fake_time_cuda)
    monkeypatch.setattr(hz, "env_header", lambda *a, **k: {})
    monkeypatch.setattr(e2e, "Bf16PagedAttention", SdpaStandIn)
    monkeypatch.setattr(ap, "sustain", lambda fn, s, label: (fn(), sustained.append(label)))
    cpu = torch.device("cpu")
    for bf16 in (False, True):
        args = types.SimpleNamespace(batch=[1], context=700, rep=1, sustain=0.1, bf16=bf16)
        assert ap.stack(args, dev=cpu) == 0
    out = capsys.readouterr().out
    for case in ("stack (append+decode", "decodes only", "appends only", "layer 0 decode x36"):
        assert f"batch 1 context 700 {case}" in out
    assert "bf16 batch 1 context 700 layer 0 decode x36" in out
    assert "bf16 batch 1 context 700 decodes only" not in out
    assert len(timed) == 6
    assert sustained == ["batch 1 context 700 decode", "bf16 batch 1 context 700 decode"]
