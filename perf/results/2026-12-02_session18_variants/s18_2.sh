#!/bin/bash
# session 18, call 2: as call 1 (s18_1.sh) for qwen3-8b batch 1 / 8 at 64K, the text output kept
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for m in "qwen3-8b 1 65536" "qwen3-8b 8 65536" "qwen3-8b 1 131072"; do
  set -- $m
  for v in trace trace_nocons trace_noload; do
    echo "=== $v $1 b$2 ctx$3"
    OSCAR_CUTE_BUNDLE=.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --out /tmp/t.json 2>&1 | grep -v "^ *rank\|warp busy"
  done
done > $OUT/s18_trace_loop_parts_qwen.txt
grep -E "===|call|int2 loop|rotation  |end  " $OUT/s18_trace_loop_parts_qwen.txt
