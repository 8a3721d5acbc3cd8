"""The SGLang plugin's hooks against real SGLang classes (needs ``sglang``; skipped
without it: ``pip install -e .[sglang,test]``).

* The launch command's arguments parse through SGLang's own ``prepare_server_args`` with the
  plugin loaded by ``load_plugins()`` from the installed entry point, and resolution turns
  ``int2`` into the plugin's settings; unsupported combinations fail at startup.
* SGLang's own ``_build_mha_kv_pool`` and ``_build_full_attention_backend_from_str``, patched
  by the plugin's hooks, build the INT2 pool and backend for a Qwen3-8B-shaped config.
* SGLang's own ``KVCacheConfigurator`` under the plugin's hooks plans a capacity whose INT2
  pages, window slots (request rows, padding row, CUDA-graph spares) and sink store fit the
  KV budget, one page short of not fitting; ``configure()`` allocates exactly those bytes.
* The prefix-match hook cuts new requests' hits; the allocation hooks record request rows.

The SGLang runs are subprocesses: each loads the plugin from a clean process, as SGLang does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("sglang")

from oscar_kernels import ModelFingerprint, RotationArtifact  # noqa: E402
from oscar_kernels.integrations.sglang import hooks  # noqa: E402
from oscar_kernels.integrations.sglang import memory_plan as mp  # noqa: E402
from oscar_kernels.integrations.sglang.config import OscarConfig  # noqa: E402
from oscar_kernels.integrations.sglang.hooks import STATE  # noqa: E402
from oscar_kernels.integrations.sglang.prefix import sink_key  # noqa: E402


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
from oscar_kernels.integrations.sglang.backend import OscarInt2AttnBackend
from oscar_kernels.integrations.sglang.hooks import STATE
from oscar_kernels.integrations.sglang.pool import OscarInt2TokenToKVPool
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
with STATE.planning(4):  # what the _build_token_to_kv_pool hook records
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
from oscar_kernels.integrations.sglang import cuda_graphs
from oscar_kernels.integrations.sglang.backend import OscarInt2AttnBackend

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
cpu_rule = cuda_graphs.decode_graph_capture_bs
for forced in (False, True):
    if forced:
        cuda_graphs.decode_graph_capture_bs = lambda device: list(
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
cuda_graphs.decode_graph_capture_bs = cpu_rule
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
    captured decode batch `at` (the plugin's memory_plan functions)."""
    cfg = OscarConfig(sink_size=64, recent_size=256, sink_entries=sink_entries)
    dims = dict(num_kv_heads=num_kv_heads, head_dim=128, num_layers=36, config=cfg)
    return mp.int2_memory_cost(
        tokens, page_size=page_size, token_bytes=mp.int2_token_bytes(**dims),
        window_slot_bytes=mp.int2_window_slot_bytes(**dims),
        sink_store_bytes=mp.int2_sink_store_bytes(**dims),
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
        assert hooks._around_match_kv_cache(fake_match, req(True), None) == 1000
        assert hooks._around_match_kv_cache(fake_match, req(False), None) == 0  # no sinks
        pool = types.SimpleNamespace(sink_index={sink_key(list(range(64)), 64, (None, None)): 0},
                                     page_size=16)
        previous, STATE.pool = STATE.pool, pool
        try:
            assert hooks._around_match_kv_cache(fake_match, req(False), None) == 736
        finally:
            STATE.pool = previous
        os.environ["OSCAR_SINK_SIZE"] = "0"  # no sinks to keep: only the recent cut
        assert hooks._around_match_kv_cache(fake_match, req(False), None) == 744
    finally:
        os.environ.pop("OSCAR_SINK_SIZE")
        os.environ.pop("OSCAR_RECENT_SIZE")
    assert calls == [None, None, 0, None, 736, None, 744]


def test_alloc_hooks_mark_rows(hooks_applied):
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    rtp = ReqToTokenPool(4, 64, "cpu", False)
    reqs = [types.SimpleNamespace(kv=types.SimpleNamespace(holds_kv=False, req_pool_idx=None,
                                                           kv_allocated_len=0),
                                  origin_input_ids=list(range(i, i + 100)), extra_key=None,
                                  lora_id=None) for i in range(2)]
    rows = rtp.alloc(reqs)
    assert all(STATE.is_fresh(r) for r in rows)
    assert STATE.row_sink_key(rows[1]) == sink_key(list(range(1, 101)), 64, (None, None))
