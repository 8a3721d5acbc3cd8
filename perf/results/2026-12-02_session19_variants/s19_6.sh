#!/bin/bash
# session 19, call 6: 4 producer warps in the wide pair build without merge CTAs (the merge CTAs of
# calls 3-5 could not be resident with 12-warp CTAs of 168 registers, 1 per SM): GPU tests of the
# wide pair builds with it, then qwen3-8b batch 1 timing: shipped (merge CTAs), shipped without
# merge CTAs (decode_pair_w8, 8 stages) and the producer-warp decode_pair_w8 (8 stages).
export OSCAR_GIT_COMMIT=${C:-unknown}
export OSCAR_CUTE_RING4=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OSCAR_CUTE_MERGE_CTAS=0 OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/wsw PYTHONPATH=. timeout 300 python3 -m pytest -m gpu -q -x tests/cute/test_cute_gpu.py -k "w8 or warps or wide or splits or batch" 2>&1 | tail -3 | tee $OUT/s19_wsw_tests.txt
bash perf/ab.sh $OUT/s19_ab_wsw_b1.txt "new OSCAR_CUTE_MERGE_CTAS=0@new OSCAR_CUTE_MERGE_CTAS=0@b:.carry/bundles/wsw" 3 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072
