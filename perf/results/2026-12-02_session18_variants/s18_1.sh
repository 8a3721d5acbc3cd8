#!/bin/bash
# session 18, call 1: what bounds the INT2 loop -- trace bundles with the loop's math left out (nocons: copies and waits only) or its copies left out (noload: math on the ring's stale contents), against the plain trace bundle
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for m in "qwen3-8b 1 65536" "qwen3-8b 8 65536" "llama3-70b-tp8 1 65536" "llama3-70b-tp8 32 131072" "qwen3-8b 128 65536"; do
  set -- $m
  for v in trace trace_nocons trace_noload; do
    echo "=== $v $1 b$2 ctx$3"
    OSCAR_CUTE_BUNDLE=.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --out $OUT/s18_trace_${v}_$1_b$2_$3.json 2>&1 | grep -v "^ *rank\|warp busy"
  done
done
