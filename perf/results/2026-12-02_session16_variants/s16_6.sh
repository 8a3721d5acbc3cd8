#!/bin/bash
# session 16, call 7: the merge-CTA build without the 2-CTAs-per-SM register bound (bundle reg: min_blocks_per_mp 1 -> 176 registers, 141.5 SASS per chunk) against the shipped one at batch 1; GPU tests with it
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s16_ab_reg.txt "new b:.carry/bundles/reg" 4 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/reg PYTHONPATH=. timeout 200 python3 -m pytest -m gpu tests/cute -q -p no:cacheprovider 2>&1 | tail -2 | tee $OUT/s16_tests_reg.txt
