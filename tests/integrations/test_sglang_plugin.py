"""The SGLang plugin against real SGLang classes (needs ``sglang``; CI skips this file).

Run here in a separate venv: ``/work/venv-sglang/bin/python -m pytest -q
tests/integrations/test_sglang_plugin.py`` (output recorded under results/sglang/).

* The launch command's arguments parse through SGLang's own ``prepare_server_args`` with the
  plugin loaded by ``load_plugins()`` from the installed entry point, and resolution turns
  ``int2`` into the plugin's settings; unsupported combinations fail at startup.
* SGLang's own ``_build_mha_kv_pool`` and ``_build_full_attention_backend_from_str``, patched
  by the plugin's hooks, build the INT2 pool and backend for a Qwen3-8B-shaped config.
* The backend, driven with real ``ForwardBatch``/``RadixAttention``/``ReqToTokenPool``
  objects, equals the public ops for extend (chunked prefill) and decode, and a request
  reusing a cached 1,000-token prefix in a stale request row gets its window rebuilt.
* SGLang's own ``KVCacheConfigurator`` under the plugin's hooks plans a capacity whose INT2
  pages, window slots (request rows, padding row, CUDA-graph spares) and sink store fit the
  KV budget, one page short of not fitting; ``configure()`` allocates exactly those bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

pytest.importorskip("sglang")

from helpers import i32, random_rotation  # noqa: E402
from oscar_kernels import ModelFingerprint, RotationArtifact, ops  # noqa: E402
from oscar_kernels.errors import UnsupportedConfigError  # noqa: E402
from oscar_kernels.integrations import sglang as plugin  # noqa: E402

QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
            "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("Qwen3-8B")
    (d / "config.json").write_text(json.dumps(QWEN3_8B))
    rot = d / "oscar_rotations"
    rot.mkdir()
    RotationArtifact.hadamard(ModelFingerprint(36, 8, 32, 128)).save(rot / "hadamard.safetensors")
    return d


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.getcwd())
    for k in list(env):
        if k.startswith("OSCAR_"):
            env.pop(k)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


LAUNCH = ["--model-path", "{m}", "--kv-cache-dtype", "int2", "--oscar-rotation-path",
          "./oscar_rotations/", "--oscar-sink-size", "64", "--oscar-recent-size", "256",
          "--tp", "1", "--port", "30000", "--device", "cpu"]


def test_launch_arguments_parse_and_resolve(model_dir):
    argv = [a.format(m=model_dir) for a in LAUNCH]
    code = f"""
import os
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
from sglang.srt.server_args import prepare_server_args
sa = prepare_server_args({argv!r})
assert sa.kv_cache_dtype == "int2", sa.kv_cache_dtype
sa.resolve_once()
print("resolved kv_cache_dtype", sa.kv_cache_dtype)
print("env", sorted((k, v) for k, v in os.environ.items() if k.startswith("OSCAR_")))
print("hooks", sorted(t for t in HookRegistry._patched if "oscar" in str(HookRegistry._hooks[t])))
"""
    r = _run(code, model_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resolved kv_cache_dtype auto" in r.stdout
    assert "('OSCAR_KV_CACHE_DTYPE', 'int2')" in r.stdout
    assert "('OSCAR_ROTATION_PATH', './oscar_rotations/')" in r.stdout
    assert "('OSCAR_RECENT_SIZE', '256')" in r.stdout
    for target in ("_build_mha_kv_pool", "_build_full_attention_backend_from_str",
                   "resolve_once", "alloc_rows", "match_kv_cache", "_compute_cell_size",
                   "calculate_pool_sizes", "resolve_max_num_reqs", "_build_token_to_kv_pool"):
        assert target in r.stdout, r.stdout


def test_unsupported_combination_fails_at_startup(model_dir):
    argv = [a.format(m=model_dir) for a in LAUNCH] + ["--pp-size", "2"]
    code = f"""
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
prepare_server_args({argv!r}).resolve_once()
"""
    r = _run(code, model_dir)
    assert r.returncode != 0
    assert "does not support: pipeline parallelism" in r.stderr


def test_real_builders_select_int2_pool_and_backend(model_dir):
    """SGLang's own builder functions, patched by the plugin, return the INT2 classes
    (as TP rank 1 of 2); a head_dim that is not a power of two is rejected."""
    code = f"""
import os, types, torch
os.environ.update(OSCAR_KV_CACHE_DTYPE="int2", OSCAR_ROTATION_PATH="{model_dir}/oscar_rotations",
                  OSCAR_SINK_SIZE="64", OSCAR_RECENT_SIZE="256", OSCAR_BACKEND="reference")
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.model_executor.model_runner_components import attention_backend_setup as abs_
from oscar_kernels.integrations.sglang_backend import OscarInt2TokenToKVPool, OscarInt2AttnBackend
from sglang.srt.runtime_context import get_parallel
get_parallel().override_permanently(tp_size=2, tp_rank=1, attn_tp_size=2, attn_tp_rank=1)
mc = ModelConfig("{model_dir}")
conf = types.SimpleNamespace(model_config=mc, device="cpu", pool_page_size=1,
    kv_cache_dtype=torch.bfloat16, use_mla_backend=False,
    layer_info=types.SimpleNamespace(start_layer=0, end_layer=36, num_effective_layers=36))
try:  # before resolve_max_num_reqs the window slots cannot be planned
    KVCacheConfigurator._build_mha_kv_pool(conf, max_total_num_tokens=64, mha_pool_class=None)
except Exception as e:
    print("unplanned", type(e).__name__, e)
from oscar_kernels.integrations import sglang as plugin
plugin._PLANNED_ROWS.append(4)  # what the _build_token_to_kv_pool hook records
pool = KVCacheConfigurator._build_mha_kv_pool(conf, max_total_num_tokens=64,
                                               mha_pool_class=None)
print("pool", type(pool).__name__, len(pool.layers), pool.spec)
print("slots", pool.num_window_slots)
runner = types.SimpleNamespace(token_to_kv_pool=pool, device="cpu", model_config=mc,
    req_to_token_pool=ReqToTokenPool(4, 128, "cpu", False))
backend = abs_._build_full_attention_backend_from_str(model_runner=runner,
    backend_str="flashinfer", init_new_workspace=False)
print("backend", type(backend).__name__, backend.num_qo_heads)
from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator
print("cell", DefaultPoolConfigurator._compute_cell_size(None, conf, 36))
mc.head_dim = 96
try:
    KVCacheConfigurator._build_mha_kv_pool(conf, max_total_num_tokens=64, mha_pool_class=None)
except Exception as e:
    print("rejected", type(e).__name__, e)
"""
    r = _run(code, model_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    # rank 1 of 2: half of Qwen3-8B's 8 KV heads and 32 query heads
    assert "pool OscarInt2TokenToKVPool 36 CacheSpec(num_kv_heads=4, head_dim=128, page_size=1" \
        in r.stdout, r.stdout
    assert "sink_size=64, recent_size=256" in r.stdout
    assert "backend OscarInt2AttnBackend 16" in r.stdout
    assert "unplanned UnsupportedConfigError" in r.stdout and "max_running_requests" in r.stdout
    # 4 request rows + the padding row; no decode CUDA graph on the CPU, so no spares
    assert "slots 5" in r.stdout
    # SGLang's cell size under int2 (4 heads on this rank): 36 layers x 288 B of INT2 pages;
    # windows, graph spares and the sink store are planned by calculate_pool_sizes
    assert "cell 10368" in r.stdout, r.stdout
    assert "rejected UnsupportedConfigError" in r.stdout and "power of two" in r.stdout


PLAN_CODE = """
import json, os, random, types, torch
os.environ.update(OSCAR_KV_CACHE_DTYPE="int2", OSCAR_ROTATION_PATH="{model_dir}/oscar_rotations",
                  OSCAR_SINK_SIZE="64", OSCAR_RECENT_SIZE="256", OSCAR_BACKEND="reference")
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import publish, get_parallel, get_exec
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
    SpecAuxHiddenStateConfig)
from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from oscar_kernels.integrations import sglang as plugin
from oscar_kernels.integrations.sglang_backend import OscarInt2AttnBackend

GRAPH_BS = ["--cuda-graph-bs-decode"] + [str(b) for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48)]

def configurator(page_size, tp_size=1, graphs=True, device="cuda"):
    # device "cuda": SGLang's decode-graph rule (config_from_budget allocates nothing);
    # "cpu": configure() below allocates the pools in host memory
    sa = prepare_server_args(["--model-path", "{model_dir}", "--device", "cpu",
                              "--page-size", str(page_size), "--tp-size", str(tp_size)]
                             + (GRAPH_BS if graphs else ["--disable-cuda-graph"]))
    sa.resolve_once()
    publish(sa, role="scheduler")
    # this process plays the last rank
    get_parallel().override_permanently(tp_rank=tp_size - 1, attn_tp_rank=tp_size - 1)
    return sa, KVCacheConfigurator(device=device, gpu_id=0, attn_dp_size=1, pp_size=1,
        pp_group=None, model=None, model_config=ModelConfig("{model_dir}"), server_args=sa,
        kv_cache_dtype=torch.bfloat16, model_dtype=torch.bfloat16, page_size=page_size,
        sliding_window_size=None, spec_algorithm=SpeculativeAlgorithm.NONE,
        is_draft_worker=False, post_capture_kv_active=False,
        spec_aux_config=SpecAuxHiddenStateConfig(), is_hybrid_swa=False,
        is_hybrid_swa_compress=False, use_mla_backend=False,
        layer_info=ModelLayerInfo(start_layer=0, end_layer=36, num_effective_layers=36),
        forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None,
        memory_pool_config=None, kv_cache_dtype_str="auto")

def captured_max_bs(sa, rows):
    # SGLang's own capture list for a request pool of `rows` rows (the decode runner's call)
    runner = types.SimpleNamespace(req_to_token_pool=types.SimpleNamespace(size=rows),
                                   server_args=sa)
    return max(get_batch_sizes_to_capture(runner, 1)[0])

def out(**kw):
    print("PLAN " + json.dumps(kw), flush=True)

def at(sa, kvc, tokens, graphs):
    reqs = kvc.resolve_max_num_reqs(tokens)
    return dict(reqs=reqs, max_bs=captured_max_bs(sa, reqs) if graphs else 0)

rng = random.Random(7)
for page_size in (1, 16):
    for graphs in (True, False):
        sa, kvc = configurator(page_size, graphs=graphs)
        for entries in (32, 0):
            os.environ["OSCAR_SINK_ENTRIES"] = str(entries)
            for _ in range(2):
                budget = rng.randrange(1 << 29, 1 << 36)
                t = kvc.config_from_budget(budget).max_total_num_tokens
                out(kind="budget", page_size=page_size, graphs=graphs, entries=entries,
                    budget=budget, tokens=t, now=at(sa, kvc, t, graphs),
                    next=at(sa, kvc, t + page_size, graphs))
os.environ["OSCAR_SINK_ENTRIES"] = "32"
# the whole startup path: profiled budget -> plan -> pools (the profiler returns a fixed
# budget); on the CPU SGLang captures no decode graph, then with SGLang's GPU graph rule
# forced (the pool holds the spares; the backend's graph state allocates nothing)
cpu_rule = plugin._decode_graph_capture_bs
for forced in (False, True):
    if forced:
        plugin._decode_graph_capture_bs = lambda device: list(
            get_exec().graph.cuda_graph_config.decode.bs)
    sa, kvc = configurator(1, device="cpu")
    budget = (1 << 30) + rng.randrange(1 << 20)
    KVCacheConfigurator._profile_available_bytes = lambda self, pre_model_load_memory: budget
    res = kvc.configure(pre_model_load_memory=0)
    pool = res.token_to_kv_pool
    rows = res.req_to_token_pool.req_to_token.shape[0]
    max_bs = captured_max_bs(sa, res.req_to_token_pool.size) if forced else 0
    before = sum(pool.get_kv_size_bytes())
    runner = types.SimpleNamespace(token_to_kv_pool=pool, device="cpu",
                                   model_config=kvc.model_config,
                                   req_to_token_pool=res.req_to_token_pool)
    backend = OscarInt2AttnBackend(runner)
    errors = []
    if forced:
        backend.init_cuda_graph_state(max_bs, max_bs)
        # a capture batch: max_bs copies of the padding row 0
        slots = backend._window_slots(torch.zeros(max_bs, dtype=torch.int64)).tolist()
        assert len(set(slots)) == max_bs and max(slots) < pool.num_window_slots, slots
    for bad in (max(max_bs, 1) + 1,):
        try:
            backend.init_cuda_graph_state(bad, bad)
        except Exception as e:
            errors.append(type(e).__name__ + ": " + str(e))
    out(kind="configure", forced=forced, budget=budget, pool=type(pool).__name__,
        tokens=res.max_total_num_tokens, reqs=res.max_running_requests, rows=rows,
        max_bs=max_bs, slots=pool.num_window_slots, spare=backend.spare_slots,
        next=at(sa, kvc, res.max_total_num_tokens + 1, forced),
        sink_bytes=sum(k.nbytes + v.nbytes for k, v in pool.sink_store),
        window_bytes=sum(c.k_window.nbytes + c.v_window.nbytes for c in pool.layers),
        page_bytes=sum(c.k_codes.nbytes + c.k_params.nbytes + c.v_codes.nbytes
                       + c.v_params.nbytes for c in pool.layers),
        kv_size=before, kv_size_after=sum(pool.get_kv_size_bytes()), errors=errors)
plugin._decode_graph_capture_bs = cpu_rule
from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
out(kind="default_bs", h200=generate_decode_cuda_graph_batch_sizes(sa, 256),
    max32=generate_decode_cuda_graph_batch_sizes(sa, 32))
sa, kvc = configurator(16)
try:
    kvc.config_from_budget(300_000_000)
except ValueError as e:
    out(kind="error", type=type(e).__name__, msg=str(e))
# TP rank 1 of 2: half the KV heads, half of every per-token / per-slot / store byte
sa, kvc = configurator(1, tp_size=2)
budget = rng.randrange(1 << 29, 1 << 36)
t = kvc.config_from_budget(budget).max_total_num_tokens
out(kind="tp2", budget=budget, tokens=t, now=at(sa, kvc, t, True), next=at(sa, kvc, t + 1, True),
    attn_tp=[get_parallel().attn_tp_rank, get_parallel().attn_tp_size])
"""


def _cost(tokens, at, *, page_size, num_kv_heads=8, sink_entries=32):
    """Bytes the INT2 pool allocates for `tokens` with SGLang's request rows and largest
    captured decode batch `at` (pure functions of the plugin)."""
    cfg = plugin.OscarConfig(sink_size=64, recent_size=256, sink_entries=sink_entries)
    dims = dict(num_kv_heads=num_kv_heads, head_dim=128, num_layers=36, config=cfg)
    return plugin.int2_memory_cost(
        tokens, page_size=page_size, token_bytes=plugin.int2_token_bytes(**dims),
        window_slot_bytes=plugin.int2_window_slot_bytes(**dims),
        sink_store_bytes=plugin.int2_sink_store_bytes(**dims),
        max_running_requests=lambda t: at["reqs"], graph_max_bs=lambda r: at["max_bs"])


def test_memory_plan_fits_the_kv_budget_with_all_window_slots(model_dir):
    """SGLang's real KVCacheConfigurator (Qwen3-8B config, CPU) under the plugin's hooks.

    For random budgets, page sizes 1 and 16, decode CUDA graphs on (capture list up to 48)
    and off, sink store on and off: the planned capacity's INT2 pages + window slots (SGLang's
    request rows from its own ``resolve_max_num_reqs``, the padding row, and one spare per
    repeated padding row up to SGLang's own largest captured batch from
    ``get_batch_sizes_to_capture``) + sink store fit the budget, and one more page would not.
    ``configure()`` allocates exactly those bytes (without graphs on the CPU, and with the GPU
    graph rule forced: the backend's graph state then uses the pool's spares and allocates
    nothing; one batch more than planned is a typed error naming the flag). Too small a
    budget is a ValueError naming the flags; TP rank 1 of 2 plans with half the bytes."""
    r = _run(PLAN_CODE.format(model_dir=model_dir), model_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line[5:]) for line in r.stdout.splitlines() if line.startswith("PLAN ")]
    budgets = [x for x in rows if x["kind"] == "budget"]
    assert len(budgets) == 16
    for x in budgets:
        ps, b, t = x["page_size"], x["budget"], x["tokens"]
        kw = dict(page_size=ps, sink_entries=x["entries"])
        assert t % ps == 0 and t > 0
        now, nxt = _cost(t, x["now"], **kw), _cost(t + ps, x["next"], **kw)
        assert now.total_bytes <= b < nxt.total_bytes, x
        assert x["now"]["reqs"] == t // 2048  # SGLang's rows, capped by the INT2 plan
        if x["graphs"]:
            assert x["now"]["max_bs"] == min(48, x["now"]["reqs"])
            assert now.window_slots == x["now"]["reqs"] + x["now"]["max_bs"]
        else:
            assert now.window_slots == x["now"]["reqs"] + 1
    for conf in (x for x in rows if x["kind"] == "configure"):
        assert conf["pool"] == "OscarInt2TokenToKVPool"
        t, reqs = conf["tokens"], conf["reqs"]
        assert reqs == t // 2048 and conf["rows"] == reqs + 1
        plan = _cost(t, {"reqs": reqs, "max_bs": conf["max_bs"]}, page_size=1)
        # the pool allocates exactly the planned bytes, and they fit; one more page would not
        assert (conf["page_bytes"], conf["window_bytes"], conf["sink_bytes"]) == \
            (plan.page_bytes, plan.window_bytes, plan.sink_store_bytes)
        assert conf["kv_size"] == conf["kv_size_after"] == plan.total_bytes <= conf["budget"]
        assert _cost(t + 1, conf["next"], page_size=1).total_bytes > conf["budget"]
        assert conf["slots"] == plan.window_slots
        assert conf["spare"] == max(conf["max_bs"] - 1, 0)
        if conf["forced"]:
            assert conf["max_bs"] == min(48, reqs) > 1
        assert len(conf["errors"]) == 1 and "UnsupportedConfigError" in conf["errors"][0]
        assert "--cuda-graph-max-bs-decode" in conf["errors"][0]
    assert [c["forced"] for c in rows if c["kind"] == "configure"] == [False, True]
    err = next(x for x in rows if x["kind"] == "error")
    assert err["type"] == "ValueError"
    for part in ("--oscar-sink-cache-entries 32", "301,989,888 B", "--cuda-graph-max-bs-decode",
                 "--oscar-sink-size 64", "got a budget of 300,000,000 B"):
        assert part in err["msg"], err["msg"]
    # the decode capture lists of the docs table (test_qwen3_8b_numbers_in_docs): SGLang's
    # default for max_bs 256 (H200 at TP < 4) and for --cuda-graph-max-bs-decode 32
    lists = next(x for x in rows if x["kind"] == "default_bs")
    assert lists["h200"] == [1, 2, 4, 8, 12] + list(range(16, 257, 8))
    assert lists["max32"] == [1, 2, 4, 8, 12, 16, 24, 32]
    tp2 = next(x for x in rows if x["kind"] == "tp2")
    assert tp2["attn_tp"] == [1, 2]
    now = _cost(tp2["tokens"], tp2["now"], page_size=1, num_kv_heads=4)
    assert now.sink_store_bytes == 150_994_944
    assert now.total_bytes <= tp2["budget"] < _cost(tp2["tokens"] + 1, tp2["next"], page_size=1,
                                                   num_kv_heads=4).total_bytes


# ------------------------------------------------------ backend with real ForwardBatch
H, HQ, D = 2, 8, 64


class _Harness:
    """The scheduler's part: request rows, token slots, ForwardBatch objects."""

    def __init__(self, gen, *, sink=16, recent=64, num_layers=2, sink_entries=32, spares=3):
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from oscar_kernels.integrations.sglang_backend import (OscarInt2AttnBackend,
                                                               OscarInt2TokenToKVPool)

        cfg = plugin.OscarConfig(sink_size=sink, recent_size=recent, backend="reference",
                                 sink_entries=sink_entries)
        self.rots = [random_rotation(H, D, gen) for _ in range(num_layers)]
        self.rtp = ReqToTokenPool(8, 2048, "cpu", False)
        # window slots as planned: 8 request rows, the padding row 0, graph spares
        self.pool = OscarInt2TokenToKVPool(4096, 1, torch.bfloat16, H, D, num_layers, "cpu",
                                           False, rotations=self.rots, config=cfg,
                                           num_window_slots=9 + spares)
        self.pool.num_qo_heads = HQ
        runner = types.SimpleNamespace(token_to_kv_pool=self.pool, req_to_token_pool=self.rtp,
                                       device="cpu")
        self.backend = OscarInt2AttnBackend(runner)
        self.layers = [RadixAttention(HQ, D, D ** -0.5, H, i) for i in range(num_layers)]
        self.next_slot = 1

    def new_row(self):
        return self.rtp.alloc_rows(1)[0]

    def slots(self, n):
        s = torch.arange(self.next_slot, self.next_slot + n, dtype=torch.int32)
        self.next_slot += n
        return s

    def batch(self, mode, rows, seq_lens, prefix_lens=None, ext_lens=None):
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        fb = ForwardBatch(forward_mode=getattr(ForwardMode, mode), batch_size=len(rows),
                          input_ids=torch.zeros(sum(ext_lens or [1] * len(rows)),
                                                dtype=torch.int64),
                          req_pool_indices=torch.tensor(rows, dtype=torch.int64),
                          seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
                          out_cache_loc=torch.zeros(1, dtype=torch.int64),
                          seq_lens_sum=sum(seq_lens))
        fb.seq_lens_cpu = fb.seq_lens.clone()
        fb.req_pool_indices_cpu = fb.req_pool_indices.clone()
        if mode == "EXTEND":
            fb.extend_prefix_lens_cpu = list(prefix_lens)
            fb.extend_seq_lens_cpu = list(ext_lens)
        return fb

    def forward(self, fb, qkv):
        self.backend.init_forward_metadata(fb)
        outs = []
        for layer, (q, k, v) in zip(self.layers, qkv):
            o = self.backend.forward(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1),
                                     v.reshape(v.shape[0], -1), layer, fb)
            outs.append(o.reshape(-1, HQ, D))
        return outs


@pytest.fixture
def hooks_applied():
    from sglang.srt.plugins.hook_registry import HookRegistry

    os.environ["OSCAR_KV_CACHE_DTYPE"] = "int2"
    plugin.register()
    HookRegistry.apply_hooks()
    yield
    os.environ.pop("OSCAR_KV_CACHE_DTYPE", None)


def _qkv(gen, n, layers=2):
    return [(torch.randn(n, HQ, D, generator=gen).to(torch.bfloat16),
             torch.randn(n, H, D, generator=gen).to(torch.bfloat16),
             torch.randn(n, H, D, generator=gen).to(torch.bfloat16)) for _ in range(layers)]


def test_backend_extend_decode_equal_ops(hooks_applied, gen):
    hz = _Harness(gen)
    rows = [hz.new_row(), hz.new_row()]
    lens = [150, 97]
    for r, n in zip(rows, lens):
        hz.rtp.req_to_token[r, :n + 3] = hz.slots(n + 3)
    # chunked prefill: two chunks, then three decode steps
    chunks = [[100, 60], [50, 37]]
    done = [0, 0]
    qkv_all = [_qkv(gen, sum(c)) for c in chunks]
    for c, qkv in zip(chunks, qkv_all):
        now = [d + x for d, x in zip(done, c)]
        hz.forward(hz.batch("EXTEND", rows, now, done, c), qkv)
        done = now
    dec = [_qkv(gen, 2) for _ in range(3)]
    got = [hz.forward(hz.batch("DECODE", rows, [n + s + 1 for n in lens]), q) for s, q in
           enumerate(dec)]
    # the same through the public ops on a fresh cache: one extend over the whole prompt
    from oscar_kernels.integrations.sglang import page_table_from_req_to_token
    from helpers import poisoned_cache

    for li in range(2):
        cache = poisoned_cache(hz.pool.spec, hz.pool.num_pages, hz.pool.num_window_slots)
        parts = [[], [], []]  # q, k, v of the whole prompt, sequence by sequence
        for b in range(2):
            for qkv, c in zip(qkv_all, chunks):
                off = 0 if b == 0 else c[0]
                for t in range(3):
                    parts[t].append(qkv[li][t][off:off + c[b]])
        q, k, v = (torch.cat(p) for p in parts)
        ip, ix, last = page_table_from_req_to_token(hz.rtp.req_to_token, i32(rows), i32(lens), 1)
        ops.paged_extend_attention(q, k, v, i32([0, lens[0], sum(lens)]), cache, ip, ix, last,
                                   i32(rows), hz.rots[li], backend="reference")
        for s, qkvd in enumerate(dec):
            n = [x + s + 1 for x in lens]
            ip, ix, last = page_table_from_req_to_token(hz.rtp.req_to_token, i32(rows), i32(n), 1)
            qd, kd, vd = qkvd[li]
            ops.quantize_append_paged_kv_cache(kd, vd, i32([0, 1]), i32([x - 1 for x in n]),
                                               cache, ix, ip, last, i32(rows), hz.rots[li],
                                               backend="reference")
            want = ops.paged_decode_attention(qd, cache, ip, ix, last, i32(rows), hz.rots[li],
                                              backend="reference")
            assert torch.equal(got[s][li], want), (li, s)
        assert torch.equal(cache.k_codes[1:sum(lens) + 7],
                           hz.pool.layer_cache(li).k_codes[1:sum(lens) + 7])


def test_backend_graph_mode_planning_equals_eager(hooks_applied, gen):
    """The CUDA-graph hooks on the CPU (no graph is captured here): decode planned by
    init_forward_metadata_out_graph into the persistent buffers of init_cuda_graph_state
    (padded batch: a repeated padding row gets a spare window slot) gives the eager
    results, and the run reads the persistent buffers. The spares are the pool's planned
    ones: the graph state allocates no window memory, and a batch beyond them is a typed
    error naming the flag."""
    outs = []
    for graph in (False, True):
        g = torch.Generator().manual_seed(5)
        hz = _Harness(g)
        rows = [hz.new_row(), hz.new_row()]
        for r in rows:
            hz.rtp.req_to_token[r, :81] = hz.slots(81)
        hz.forward(hz.batch("EXTEND", rows, [80, 80], [0, 0], [80, 80]), _qkv(g, 160))
        dec = _qkv(g, 4)
        if graph:
            windows = [(c.k_window.data_ptr(), c.v_window.data_ptr()) for c in hz.pool.layers]
            hz.backend.init_cuda_graph_state(4, 4)
            # the pool's 3 planned spares serve batch 4; nothing is allocated
            assert [(c.k_window.data_ptr(), c.v_window.data_ptr())
                    for c in hz.pool.layers] == windows
            with pytest.raises(UnsupportedConfigError, match=r"batch 5 need 4 spare window "
                                                             r"slots.*reserved 3.*"
                                                             r"--cuda-graph-max-bs-decode"):
                hz.backend.init_cuda_graph_state(5, 5)
            with pytest.raises(UnsupportedConfigError, match="repeats request rows 4 times"):
                hz.backend._window_slots(torch.zeros(5, dtype=torch.int64))
            # bs padded to 4 with SGLang's padding row 0 (twice: the repeat gets a spare slot)
            fb = hz.batch("DECODE", rows + [0, 0], [81, 81, 1, 1])
            hz.backend.init_forward_metadata_out_graph(fb, in_capture=True)
            hz.backend.init_forward_metadata_in_graph(fb)
            meta = hz.backend.forward_metadata
            assert meta["positions"].data_ptr() == hz.backend.graph_buffers["positions"].data_ptr()
            plan = meta["wrapper"]._plan
            assert plan["indptr"].data_ptr() == hz.backend.graph_buffers["indptr"].data_ptr()
            assert sorted(plan["window_slots"].tolist())[-1] >= hz.backend.num_rows
            got = []
            for layer, (q, k, v) in zip(hz.layers, dec):
                got.append(hz.backend.forward(q.reshape(4, -1), k.reshape(4, -1),
                                              v.reshape(4, -1), layer, fb).reshape(-1, HQ, D))
            outs.append([o[:2] for o in got])
        else:
            outs.append(hz.forward(hz.batch("DECODE", rows, [81, 81]),
                                   [tuple(t[:2] for t in x) for x in dec]))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_backend_prefix_hit_equals_independent_requests(hooks_applied, gen):
    """Two requests sharing a cached 1,000-token prefix give the same attention outputs as
    independent requests. Request A writes the prefix; B arrives with the same first tokens
    in a request row an unrelated request used before (stale window slot). The plugin's
    prefix-match hook cuts B's hit to P' (reusable_prefix_len) so SGLang recomputes
    [P', P) from real K/V; the sink store gives B A's BF16 sinks."""
    from oscar_kernels.integrations.sglang_backend import has_sink_entry, set_row_sink_key

    hz = _Harness(gen, sink=64, recent=256, num_layers=2)
    P, S = 1000, 24
    tokens = torch.randint(0, 1000, (P + S,), generator=gen).tolist()
    key = plugin.sink_key(tokens, 64)
    prefix_qkv = _qkv(gen, P)
    sfx_qkv = _qkv(gen, S)
    a = hz.new_row()
    set_row_sink_key(a, key)
    hz.rtp.req_to_token[a, :P] = hz.slots(P)
    hz.forward(hz.batch("EXTEND", [a], [P], [0], [P]), prefix_qkv)  # A's prefill
    assert has_sink_entry(key)
    keep = plugin.reusable_prefix_len(P, sink_size=64, recent_size=256, page_size=1,
                                      have_sinks=has_sink_entry(key))
    assert keep == P - 256
    outs = {}
    for name, stale in (("B", True), ("C", False)):
        if stale:  # an unrelated request occupies a row, then frees it
            junk = hz.new_row()
            set_row_sink_key(junk, plugin.sink_key(list(range(64)), 64))
            hz.rtp.req_to_token[junk, :300] = hz.slots(300)
            hz.forward(hz.batch("EXTEND", [junk], [300], [0], [300]), _qkv(gen, 300))
            hz.rtp.free_slots.append(junk)
        row = hz.new_row()
        assert not stale or row == junk
        set_row_sink_key(row, key)
        hz.rtp.req_to_token[row, :keep] = hz.rtp.req_to_token[a, :keep]  # the (cut) hit
        hz.rtp.req_to_token[row, keep:P + S] = hz.slots(P + S - keep)
        qkv = [tuple(torch.cat([pq[t][keep:], sq[t]]) for t in range(3))
               for pq, sq in zip(prefix_qkv, sfx_qkv)]
        o = hz.forward(hz.batch("EXTEND", [row], [P + S], [keep], [P + S - keep]), qkv)
        outs[name] = [x[P - keep:] for x in o]
        hz.rtp.free_slots.append(row)
    # fully independent request: prefix and suffix written by itself
    ind = hz.new_row()
    set_row_sink_key(ind, key)
    hz.rtp.req_to_token[ind, :P + S] = hz.slots(P + S)
    qkv = [tuple(torch.cat([pq[t], sq[t]]) for t in range(3)) for pq, sq in zip(prefix_qkv,
                                                                              sfx_qkv)]
    full = [x[P:] for x in hz.forward(hz.batch("EXTEND", [ind], [P + S], [0], [P + S]), qkv)]
    for li in range(2):
        assert torch.equal(outs["B"][li], full[li]), li
        assert torch.equal(outs["C"][li], full[li]), li


def test_backend_without_sink_store(hooks_applied):
    """--oscar-sink-cache-entries 0: the pool holds no sink store, a prefill that completes
    the sinks stores nothing, outputs equal those with a store, and a prefix hit is cut to 0
    (the request recomputes its prompt)."""
    from oscar_kernels.integrations.sglang_backend import has_sink_entry, set_row_sink_key

    outs = {}
    for entries in (32, 0):
        g = torch.Generator().manual_seed(11)
        hz = _Harness(g, sink_entries=entries)
        assert sum(k.nbytes + v.nbytes for k, v in hz.pool.sink_store) == \
            plugin.int2_sink_store_bytes(num_kv_heads=H, head_dim=D, num_layers=2,
                                         config=hz.pool.config)
        row = hz.new_row()
        key = plugin.sink_key(list(range(200)), 16)
        set_row_sink_key(row, key)
        hz.rtp.req_to_token[row, :120] = hz.slots(120)
        outs[entries] = hz.forward(hz.batch("EXTEND", [row], [120], [0], [120]), _qkv(g, 120))
        assert has_sink_entry(key) == (entries > 0)
        assert len(hz.pool.sink_index) == (1 if entries else 0)
    assert hz.pool.sink_store[0][0].shape[0] == 0
    for a, b in zip(outs[32], outs[0]):
        assert torch.equal(a, b)
    keep = plugin.reusable_prefix_len(120, sink_size=16, recent_size=64, page_size=1,
                                      have_sinks=has_sink_entry(key))
    assert keep == 0


def test_prefix_match_hook_cuts_new_requests_only(hooks_applied):
    """The match_kv_cache hook: new requests get their hit cut (or dropped without stored
    sinks); a running request (chunked prefill, holds_kv) keeps its full match."""
    calls = []

    def fake_match(req, tree_cache, token_ids=None, *, max_prefix_len=None, cow_mamba=False):
        calls.append(max_prefix_len)
        req.prefix_len = 1000 if max_prefix_len is None else min(1000, max_prefix_len)
        return req.prefix_len

    def req(holds):
        return types.SimpleNamespace(kv=types.SimpleNamespace(holds_kv=holds), prefix_len=0,
                                     origin_input_ids=list(range(2000)), extra_key=None,
                                     lora_id=None)
    os.environ.update(OSCAR_SINK_SIZE="64", OSCAR_RECENT_SIZE="256")
    try:
        assert plugin._around_match_kv_cache(fake_match, req(True), None) == 1000
        assert plugin._around_match_kv_cache(fake_match, req(False), None) == 0  # no sinks
        from oscar_kernels.integrations import sglang_backend as sb

        pool = types.SimpleNamespace(sink_index={plugin.sink_key(list(range(64)), 64,
                                                                 (None, None)): 0},
                                     page_size=16)
        sb._ACTIVE_POOL.append(pool)
        try:
            assert plugin._around_match_kv_cache(fake_match, req(False), None) == 736
        finally:
            sb._ACTIVE_POOL.remove(pool)
        os.environ["OSCAR_SINK_SIZE"] = "0"  # no sinks to keep: only the recent cut
        assert plugin._around_match_kv_cache(fake_match, req(False), None) == 744
    finally:
        os.environ.pop("OSCAR_SINK_SIZE")
        os.environ.pop("OSCAR_RECENT_SIZE")
    assert calls == [None, None, 0, None, 736, None, 744]


def test_alloc_hooks_mark_rows(hooks_applied):
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from oscar_kernels.integrations import sglang_backend as sb

    rtp = ReqToTokenPool(4, 64, "cpu", False)
    reqs = [types.SimpleNamespace(kv=types.SimpleNamespace(holds_kv=False, req_pool_idx=None,
                                                           kv_allocated_len=0),
                                  origin_input_ids=list(range(i, i + 100)), extra_key=None,
                                  lora_id=None) for i in range(2)]
    rows = rtp.alloc(reqs)
    assert set(rows) <= sb._FRESH_ROWS
    assert sb._ROW_SINK_KEY[rows[1]] == plugin.sink_key(list(range(1, 101)), 64, (None, None))


def test_backend_rejects_unsupported_layers(hooks_applied, gen):
    from sglang.srt.layers.radix_attention import RadixAttention

    hz = _Harness(gen, num_layers=1)
    row = hz.new_row()
    hz.rtp.req_to_token[row, :10] = hz.slots(10)
    fb = hz.batch("EXTEND", [row], [10], [0], [10])
    hz.backend.init_forward_metadata(fb)
    q, k, v = _qkv(gen, 10, 1)[0]
    for layer, msg in ((RadixAttention(HQ, D, 0.1, H, 0, logit_cap=30.0), "soft-capping"),
                       (RadixAttention(HQ, D, 0.1, H, 0, sliding_window_size=128),
                        "sliding-window")):
        with pytest.raises(UnsupportedConfigError, match=msg):
            hz.backend.forward(q.reshape(10, -1), k.reshape(10, -1), v.reshape(10, -1), layer, fb)
