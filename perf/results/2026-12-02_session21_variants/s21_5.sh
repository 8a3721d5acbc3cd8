#!/bin/bash
# session 21, call 5: bench_e2e (Qwen3-8B / 4B stacks, CUDA graph per (batch, context);
# the INT2 decode without the length hint, as under a serving framework's graphs)
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 .carry/flashinfer/setup_site.py /tmp/fi_site >/dev/null 2>&1
PYTHONPATH=/tmp/fi_site:. timeout 300 python3 perf/bench_e2e.py --preset qwen3-8b,qwen3-4b --out-dir $OUT --tag 2026-12-02_h200_e2e_hnd_$C --iters 6 --warmup 2 --int2-also '' --budget-s 130 --int2-kv-layout HND > $OUT/e2e_log.txt 2>&1; tail -3 $OUT/e2e_log.txt
ls $OUT
