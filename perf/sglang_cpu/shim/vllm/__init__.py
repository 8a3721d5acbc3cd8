"""Stand-in ``vllm`` for SGLang's CPU path (perf/sglang_cpu/README.md). NOT vLLM.

SGLang 0.5.23's ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding``
on a device that is neither CUDA/HIP/NPU/XPU/MUSA/MPS nor its AMX CPU engine (our case:
``--device cpu`` without ``SGLANG_USE_CPU_ENGINE``). This package provides only that name.
Everything else (``vllm.distributed``, ``vllm.logger``...) is absent on purpose, so SGLang's
``try: import ... except ImportError`` probes keep treating vLLM as not installed.
"""
