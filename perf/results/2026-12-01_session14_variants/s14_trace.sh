#!/bin/bash
# session 14: per-CTA / per-warp traces of the shipped kernels (tr_base: git archive of
# e4f5174 built with OSCAR_CUTE_DEBUG=trace) and of the pool build (tr_pool: this tree with
# OSCAR_CUTE_POOL_DIV=8 OSCAR_CUTE_POOL_BLOCK=2, trace), merge CTAs off (no trace slots)
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export OSCAR_CUTE_TRACE=1 OSCAR_CUTE_MERGE_CTAS=0
OSCAR_CUTE_BUNDLE=$PWD/.carry/tr_base PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 8 --context 65536 --out $OUT/trace_base.json > $OUT/trace_base.txt 2>&1
OSCAR_CUTE_POOL=1 OSCAR_CUTE_BUNDLE=$PWD/.carry/tr_pool PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 8 --context 65536 --out $OUT/trace_pool.json > $OUT/trace_pool.txt 2>&1
cat $OUT/trace_base.txt $OUT/trace_pool.txt
