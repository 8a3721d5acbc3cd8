#!/bin/bash
# session 19, call 3: the producer-warp experiment (OSCAR_CUTE_DEBUG=ws build of decode_pair_mc,
# the merge-CTA build qwen3-8b batch 1 runs): GPU tests of the merge-CTA build with it, then
# alternating-round timing against the shipped bundle at batch 1.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/ws PYTHONPATH=. timeout 300 python3 -m pytest -m gpu -q -x tests/cute/test_cute_gpu.py -k "merge_ctas or graphs_replayed" 2>&1 | tail -6 | tee $OUT/s19_ws_tests.txt
if grep -q " passed" $OUT/s19_ws_tests.txt && ! grep -q "failed\|error" $OUT/s19_ws_tests.txt; then
  bash perf/ab.sh $OUT/s19_ab_ws_b1.txt "new b:.carry/bundles/ws" 5 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072
fi
