#!/bin/bash
# session 16, call 4: how fast warp 0's chunks arrive (trace,ramp bundles, 8- and 4-deep rings), and a 4-deep ring (OSCAR_CUTE_STAGES=4 bundle) against the shipped 8 at batch 1 and 8
export OSCAR_GIT_COMMIT=${C:-unknown}
for b in ramp st4ramp; do
  OSCAR_CUTE_BUNDLE=.carry/bundles/$b PYTHONPATH=. python3 perf/trace_decode.py --ramp --model qwen3-8b --batch 1 8 --context 65536 --out $OUT/s16_trace_$b.json 2>&1 | tee $OUT/s16_trace_$b.txt
done
bash perf/ab.sh $OUT/s16_ab_st4.txt "new b:.carry/bundles/st4" 3 --model qwen3-8b --batch 1 8 --context 32768 65536 131072
