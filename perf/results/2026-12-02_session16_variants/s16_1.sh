#!/bin/bash
# session 16, call 1: why 32 wide splits at qwen3-8b batch 1 are slower (traces), and 32 splits with rank weights (merge-CTA build, bundle .carry/bundles/rank)
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv
for plan in auto 8:32:mc; do
  OSCAR_CUTE_BUNDLE=.carry/bundles/trace PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 32768 65536 --plan $plan --out $OUT/s16_trace_${plan//:/_}.json 2>&1 | tee $OUT/s16_trace_${plan//:/_}.txt
done
OSCAR_CUTE_BUNDLE=.carry/bundles/rank_trace PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 32768 65536 --plan 8:32:mc --out $OUT/s16_trace_rank_8_32_mc.json 2>&1 | tee $OUT/s16_trace_rank_8_32_mc.txt
for r in 1 2 3; do
  PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 1 --context 32768 65536 131072 --plans auto 8:32:mc --rounds 1 2>&1 | sed 's/^/shipped /'
  OSCAR_CUTE_BUNDLE=.carry/bundles/rank PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 1 --context 32768 65536 131072 --plans auto 8:32:mc --rounds 1 2>&1 | sed 's/^/rank /'
done 2>&1 | tee $OUT/s16_sweep_rank_b1.txt
