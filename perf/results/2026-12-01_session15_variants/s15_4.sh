#!/bin/bash
# session 15, call 4: the merge CTA folding partials in as split bits appear (bundle .carry/bundles/fold): GPU tests, A/B at batch 1
export OSCAR_GIT_COMMIT=${C:-unknown}
OSCAR_CUTE_BUNDLE=.carry/bundles/fold PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute -q -p no:cacheprovider -k "merge_ctas or batch_1 or graph" 2>&1 | tail -15 | tee $OUT/s15_fold_tests.txt
bash perf/ab.sh $OUT/s15_ab_fold_b1.txt "new b:.carry/bundles/fold" 4 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072
