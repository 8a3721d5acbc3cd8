#!/bin/bash
# session 20, call 1: K operands without the 0xC0C0C0C0 masks (the query cancels the other
# bits: oscar_kernels.cute.unmasked_k_query). GPU tests of the new bundle, then alternating
# rounds against the shipped bundle (head_dim 128 kernels differ; d64 cubins identical).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/ukq PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider > $OUT/s20_ukq_tests.txt 2>&1; tail -3 $OUT/s20_ukq_tests.txt
if grep -q " passed" $OUT/s20_ukq_tests.txt && ! grep -q " failed\| error" $OUT/s20_ukq_tests.txt; then
  bash perf/ab.sh $OUT/s20_ab_ukq_qwen.txt "new b:.carry/bundles/ukq" 3 --model qwen3-8b --batch 1 8 32 128 --context 8192 32768 65536 131072 | tail -6
  bash perf/ab.sh $OUT/s20_ab_ukq_llama.txt "new b:.carry/bundles/ukq" 3 --model llama3-70b-tp8 --batch 1 8 32 128 --context 8192 32768 65536 131072 | tail -6
fi
