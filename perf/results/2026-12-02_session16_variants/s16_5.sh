#!/bin/bash
# session 16, call 5: the page-id/rotation reorder (bundle re: every kernel) and with it a 4-deep ring in the merge-CTA build (re4) against the shipped bundle
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s16_ab_re_qwen.txt "new b:.carry/bundles/re b:.carry/bundles/re4" 3 --model qwen3-8b --batch 1 8 --context 32768 65536 131072
bash perf/ab.sh $OUT/s16_ab_re_llama.txt "new b:.carry/bundles/re" 3 --model llama3-70b-tp8 --batch 1 32 128 --context 65536 131072
