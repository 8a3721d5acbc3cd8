#!/bin/bash
# session 17, call 9: the any-page builds (pages not a multiple of 16 tokens, e.g. SGLang's 1) at 4 stages (bundle st4) against the shipped 8
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s17_ab_st4_anypage_qwen.txt "new b:.carry/bundles/st4" 2 --page-size 1 --model qwen3-8b --batch 1 2 4 8 32 --context 32768 131072 | tail -2
bash perf/ab.sh $OUT/s17_ab_st4_anypage_llama.txt "new b:.carry/bundles/st4" 2 --page-size 1 --model llama3-70b-tp8 --batch 1 4 8 32 128 --context 32768 131072 | tail -2
bash perf/ab.sh $OUT/s17_ab_st4_anypage_smol.txt "new b:.carry/bundles/st4" 2 --page-size 1 --model smollm2 --batch 1 8 32 --context 32768 131072 | tail -2
