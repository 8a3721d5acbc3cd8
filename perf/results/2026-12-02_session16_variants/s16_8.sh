#!/bin/bash
# session 16, call 9: every kernel with a 4-deep ring (bundle st4, OSCAR_CUTE_STAGES=4) against the shipped 8 at the small batches not measured before (qwen3-8b batch 2-4, llama3-70b-tp8 batch 1-8)
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s16_ab_st4_small.txt "new b:.carry/bundles/st4" 2 --model qwen3-8b --batch 2 4 --context 32768 65536 131072
bash perf/ab.sh $OUT/s16_ab_st4_small_llama.txt "new b:.carry/bundles/st4" 2 --model llama3-70b-tp8 --batch 1 8 --context 32768 65536 131072
