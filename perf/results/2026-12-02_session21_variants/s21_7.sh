#!/bin/bash
# session 21, call 7: GPU tests of this tree (the length-hint test with wrong hints too);
# the length hint on 1-token pages (the any-page decode, llama3-70b-tp8 batch 2-7: the only
# any-page plans the hint changes) against the shapes' plan (OSCAR_CUTE_LENGTH_HINT=0)
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
T0=$(date +%s)
timeout 200 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider -rs > $OUT/tests_gpu.txt 2>&1; tail -3 $OUT/tests_gpu.txt
echo "tests t=$(( $(date +%s) - T0 ))"
bash perf/ab.sh $OUT/s21_ab_hint_anypage.txt "new OSCAR_CUTE_LENGTH_HINT=0@new" 3 --model llama3-70b-tp8 --page-size 1 --batch 2 4 7 --context 4096 16384 32768 65536 | tail -6
echo "ab t=$(( $(date +%s) - T0 ))"
