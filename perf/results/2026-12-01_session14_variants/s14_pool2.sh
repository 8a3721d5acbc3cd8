#!/bin/bash
# session 14, second pool run (rows in shared memory, claims two iterations ahead): GPU tests of the pool builds, then A/B against the shipped bundle
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export OSCAR_GIT_COMMIT=$(cat .carry/commit)
OSCAR_CUTE_BUNDLE=$PWD/.carry/b_pool8 timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/cute/test_cute_gpu.py -k "pool" -x > $OUT/tests_pool8.txt 2>&1
rc=$?
tail -25 $OUT/tests_pool8.txt
[ $rc -ne 0 ] && exit $rc
bash perf/ab.sh $OUT/ab_qwen.txt "new OSCAR_CUTE_POOL=1@b:.carry/b_pool8 OSCAR_CUTE_POOL=1@b:.carry/b_pool16" 3 --model qwen3-8b --batch 1 8 --context 32768 65536 131072
bash perf/ab.sh $OUT/ab_llama.txt "new OSCAR_CUTE_POOL=1@b:.carry/b_pool8 OSCAR_CUTE_POOL=1@b:.carry/b_pool16" 2 --model llama3-70b-tp8 --batch 32 128 --context 65536 131072
