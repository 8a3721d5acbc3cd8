#!/bin/bash
# session 19, call 5: the producer-warp experiment (4 producer warps, slower than the shipped build
# in call 4): with an 8-deep ring (the producer takes the ring prologue off the math warps),
# and per-CTA traces (trace bundles) of the shipped build vs 4 producer warps at 4 and 8 stages.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== ws4_8 tests"
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/ws4_8 PYTHONPATH=. timeout 300 python3 -m pytest -m gpu -q -x tests/cute/test_cute_gpu.py -k "merge_ctas or graphs_replayed" 2>&1 | tail -2 | tee $OUT/s19_ws_tests3.txt
for m in "qwen3-8b 1 65536" "qwen3-8b 1 131072"; do
  set -- $m
  for v in trace__4 trace_ws_4_4 trace_ws_4_8; do
    echo "=== $v $1 b$2 ctx$3"
    OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --out /tmp/t.json 2>&1 | grep -v "^ *rank\|warp busy"
  done
done > $OUT/s19_trace_ws.txt 2>&1
grep -E "===|call|int2 loop|rotation|combine|last CTA" $OUT/s19_trace_ws.txt | head -60
bash perf/ab.sh $OUT/s19_ab_ws8st_b1.txt "new b:.carry/bundles/ws4 b:.carry/bundles/ws4_8" 3 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072
