#!/bin/bash
# session 20, call 2: the unmasked-K bundle with the wide builds' rank weights 3/2 (ukq),
# 5/4 (ukq54) and 4/3 (ukq43) against the shipped bundle, alternating rounds, where the
# weights apply (single-wave wide plans with 2-8 splits).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
V="new b:.carry/bundles/ukq b:.carry/bundles/ukq54 b:.carry/bundles/ukq43"
bash perf/ab.sh $OUT/s20_ab_rank_qwen.txt "$V" 4 --model qwen3-8b --batch 4 8 --context 32768 65536 131072 | tail -16
bash perf/ab.sh $OUT/s20_ab_rank_llama.txt "$V" 4 --model llama3-70b-tp8 --batch 32 128 --context 65536 131072 | tail -16
