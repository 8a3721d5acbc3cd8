#!/bin/bash
# session 18, call 5: the merge-CTA build (qwen3-8b batch 1) with its query rotation after the ring prologue (OSCAR_CUTE_MC_EARLY=1 bundle: the first chunks' copies issued as soon as the page ids are in) -- its GPU tests, then alternating rounds against the shipped bundle
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/mce PYTHONPATH=. timeout 200 python3 -m pytest -m gpu tests/cute/test_cute_gpu.py -q -p no:cacheprovider -k "merge_ctas or replayed or planned" > $OUT/s18_mce_tests.txt 2>&1; tail -2 $OUT/s18_mce_tests.txt
bash perf/ab.sh $OUT/s18_ab_mce_b1.txt "new b:.carry/bundles/mce" 5 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072 | tail -10
