#!/bin/bash
# session 21, call 6: the wide builds' rank weights (3/2 shipped) against 7/5 and 8/5
# (bundles w75 / w85: OSCAR_CUTE_RANK_WEIGHTS at build), and for qwen3-8b batch 8-16 the
# unmasked decode_pair_w8 with 7/4 and 8/5 (u74 / u85: OSCAR_CUTE_K_OPERANDS=unmasked too);
# perf/ab.sh alternating rounds (cute.bench with the context as the length hint)
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
bash perf/ab.sh $OUT/s21_ab_rank_llama.txt "new b:.carry/bundles/w75 b:.carry/bundles/w85" 3 --model llama3-70b-tp8 --batch 32 128 --context 32768 65536 131072 | tail -9
echo "t=$(( $(date +%s) - T0 ))"
bash perf/ab.sh $OUT/s21_ab_rank_qwen.txt "new b:.carry/bundles/w75 b:.carry/bundles/w85 b:.carry/bundles/u74 b:.carry/bundles/u85" 3 --model qwen3-8b --batch 8 16 --context 32768 65536 131072 | tail -15
echo "t=$(( $(date +%s) - T0 ))"
