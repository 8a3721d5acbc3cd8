#!/bin/bash
# session 16, call 2: prologue stamps (OSCAR_CUTE_DEBUG=trace,pro bundle): which load holds back the CTAs that start their INT2 loop late (qwen3-8b batch 1 with 32 splits, batch 8)
export OSCAR_GIT_COMMIT=${C:-unknown}
for plan in 8:32:mc auto; do
  OSCAR_CUTE_BUNDLE=.carry/bundles/tracepro PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 65536 --plan $plan --out $OUT/s16_tracepro_b1_${plan//:/_}.json 2>&1 | tee $OUT/s16_tracepro_b1_${plan//:/_}.txt
done
OSCAR_CUTE_BUNDLE=.carry/bundles/tracepro PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 8 --context 65536 --out $OUT/s16_tracepro_b8.json 2>&1 | tee $OUT/s16_tracepro_b8.txt
