#!/bin/bash
# session 20, call 5: every head_dim-128 build with unmasked K operands but quarter 3's
# kept masked (bundle tm: OSCAR_CUTE_UNMASKED=1 OSCAR_CUTE_TOPMASK=1; the decode builds then
# have no loop spills: decode_w8 164 SASS per chunk against 176 masked) -- GPU tests, then
# alternating rounds against the shipped bundle (decode_pair_w8 / decode_w8 / decode_anypage
# masked, the other d128 builds fully unmasked).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/tm PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider > $OUT/s20_tm_tests.txt 2>&1; tail -2 $OUT/s20_tm_tests.txt
if grep -q " passed" $OUT/s20_tm_tests.txt && ! grep -q " failed\| error" $OUT/s20_tm_tests.txt; then
  bash perf/ab.sh $OUT/s20_ab_tm_llama.txt "new b:.carry/bundles/tm" 3 --model llama3-70b-tp8 --batch 1 8 32 128 --context 32768 65536 131072 | tail -6
  bash perf/ab.sh $OUT/s20_ab_tm_qwen.txt "new b:.carry/bundles/tm" 3 --model qwen3-8b --batch 1 8 16 --context 32768 65536 131072 | tail -6
fi
