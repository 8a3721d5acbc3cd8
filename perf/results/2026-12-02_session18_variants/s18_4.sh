#!/bin/bash
# session 18, call 4: as calls 1-2 (s18_1.sh, s18_2.sh) at the other shapes where #4's targets are not met: the INT2 loop with its math left out (nocons) or its copies left out (noload), trace bundles of this tree
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for m in "qwen3-8b 8 32768" "llama3-70b-tp8 1 131072" "llama3-70b-tp8 8 65536" "llama3-70b-tp8 8 131072" "llama3-70b-tp8 32 65536" "llama3-70b-tp8 128 32768" "llama3-70b-tp8 128 65536"; do
  set -- $m
  for v in trace trace_nocons trace_noload; do
    echo "=== $v $1 b$2 ctx$3"
    OSCAR_CUTE_BUNDLE=.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --out /tmp/t.json 2>&1 | grep -v "^ *rank\|warp busy"
  done
done > $OUT/s18_trace_loop_parts_rest.txt
grep -E "===|call|int2 loop|end  " $OUT/s18_trace_loop_parts_rest.txt
