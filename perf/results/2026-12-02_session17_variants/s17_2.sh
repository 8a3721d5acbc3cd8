#!/bin/bash
# session 17, call 2: the undecided shapes of call 1 (multi-wave 4-warp pair, wide decode at batch 64-256), 3 rounds
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s17_ab_st4_qwen_big.txt "new b:.carry/bundles/st4" 3 --model qwen3-8b --batch 64 128 256 --context 8192 32768 65536 131072
bash perf/ab.sh $OUT/s17_ab_st4_llama_big.txt "new b:.carry/bundles/st4" 3 --model llama3-70b-tp8 --batch 1 64 128 256 --context 8192 32768 65536 131072
