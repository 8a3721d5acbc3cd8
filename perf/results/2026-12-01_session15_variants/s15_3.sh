#!/bin/bash
# session 15, call 3: trace of qwen3-8b batch 1 (merge-CTA build): how long the merge CTA takes after the last split counts
export OSCAR_GIT_COMMIT=${C:-unknown}
OSCAR_CUTE_BUNDLE=.carry/bundles/trace PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 32768 65536 --out $OUT/s15_trace_mc.json 2>&1 | tee $OUT/s15_trace_mc.txt
OSCAR_CUTE_MERGE_CTAS=0 OSCAR_CUTE_BUNDLE=.carry/bundles/trace PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 65536 2>&1 | tee $OUT/s15_trace_fused.txt
