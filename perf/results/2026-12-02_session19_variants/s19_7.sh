#!/bin/bash
# session 19, call 7: per-CTA traces of the wide pair build without merge CTAs, shipped vs 4 producer
# warps (trace bundles; OSCAR_CUTE_MERGE_CTAS=0, OSCAR_CUTE_RING4=0: decode_pair_w8, 8 stages), qwen3-8b batch 1
export OSCAR_GIT_COMMIT=${C:-unknown}
export OSCAR_CUTE_RING4=0 OSCAR_CUTE_MERGE_CTAS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for m in "qwen3-8b 1 65536" "qwen3-8b 1 131072"; do
  set -- $m
  for rep in 1 2; do
  for v in t_trace t_trace_ws; do
    echo "=== $v $1 b$2 ctx$3 (run $rep)"
    OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --out /tmp/t.json 2>&1 | grep -v "^ *rank\|warp busy"
  done
  done
done > $OUT/s19_trace_wsw.txt 2>&1
grep -E "===|call|int2 loop|rotation|window|combine|merge tail|last CTA" $OUT/s19_trace_wsw.txt
