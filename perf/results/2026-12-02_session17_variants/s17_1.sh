#!/bin/bash
# session 17, call 1: every kernel with a 4-deep ring (bundle st4, OSCAR_CUTE_STAGES=4) against the shipped 8 over the batch range, to pick where plan takes 4 stages
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
bash perf/ab.sh $OUT/s17_ab_st4_qwen.txt "new b:.carry/bundles/st4" 2 --model qwen3-8b --batch 2 4 8 16 32 64 128 --context 32768 65536 131072
bash perf/ab.sh $OUT/s17_ab_st4_llama.txt "new b:.carry/bundles/st4" 2 --model llama3-70b-tp8 --batch 1 2 4 8 16 32 64 128 --context 32768 65536 131072
bash perf/ab.sh $OUT/s17_ab_st4_smol.txt "new b:.carry/bundles/st4" 2 --model smollm2 --batch 1 8 32 --context 32768 131072
