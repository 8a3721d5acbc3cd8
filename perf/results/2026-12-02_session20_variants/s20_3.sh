#!/bin/bash
# session 20, call 3 (tree 32b981a: unmasked K in every head_dim-128 build but
# decode_pair_w8 / decode_w8 / decode_anypage). (a) qwen3-8b batch 5-32 (decode_pair_w8,
# masked, 8 stages) against the 4-deep ring build forced (OSCAR_CUTE_RING4=1: ring4_w8,
# unmasked) and against decode_pair_w8 unmasked (bundle ukq); (b) the any-page pair build
# (1-token pages) against the bundle of 7218722 (old).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash perf/ab.sh $OUT/s20_ab_ring4_b8.txt "new OSCAR_CUTE_RING4=1@new b:.carry/bundles/ukq" 3 --model qwen3-8b --batch 5 8 16 32 --context 32768 65536 131072 | tail -9
bash perf/ab.sh $OUT/s20_ab_anypage.txt "b:.carry/bundles/old new" 3 --model qwen3-8b --page-size 1 --batch 1 8 32 --context 32768 131072 | tail -6
