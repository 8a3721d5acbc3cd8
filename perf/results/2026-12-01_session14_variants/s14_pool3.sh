#!/bin/bash
# session 14, third pool run: block claims (POOL_BLOCK pairs per atomic), bundles b_p<DIV>_<BLOCK>
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export OSCAR_GIT_COMMIT=$(cat .carry/commit)
OSCAR_CUTE_BUNDLE=$PWD/.carry/b_p8_4 timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/cute/test_cute_gpu.py -k "pool" -x > $OUT/tests_p8_4.txt 2>&1
rc=$?
tail -25 $OUT/tests_p8_4.txt
[ $rc -ne 0 ] && exit $rc
bash perf/ab.sh $OUT/ab_qwen.txt "new OSCAR_CUTE_POOL=1@b:.carry/b_p8_2 OSCAR_CUTE_POOL=1@b:.carry/b_p8_4 OSCAR_CUTE_POOL=1@b:.carry/b_p16_4" 3 --model qwen3-8b --batch 1 8 --context 32768 65536 131072
