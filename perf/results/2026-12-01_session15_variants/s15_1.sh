#!/bin/bash
# session 15, call 1: ring depth 16 (OSCAR_CUTE_STAGES=16 bundle, .carry/bundles/s16) against the shipped 8
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash perf/ab.sh $OUT/s15_ab_stages_qwen_b1.txt "new OSCAR_CUTE_MERGE_CTAS=0@new OSCAR_CUTE_MERGE_CTAS=0@b:.carry/bundles/s16" 3 --model qwen3-8b --batch 1 --context 32768 65536 131072
bash perf/ab.sh $OUT/s15_ab_stages_llama.txt "new b:.carry/bundles/s16" 3 --model llama3-70b-tp8 --batch 1 8 --context 65536 131072
