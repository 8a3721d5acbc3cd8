#!/bin/bash
# session 22, call 5: the wide builds with equal shares in a full wave (this commit's
# kernel change, bundle in .carry/bundles/new): GPU tests with it, then A/B against the
# shipped bundle (alternating rounds, cute.bench: the shipped plans, the context as hint)
# at the full-wave plans and at unaffected wide plans.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_5.txt
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/new timeout 300 python3 -m pytest -m gpu tests/cute tests/integrations -q -x 2>&1 | tail -15 > $OUT/s22_5_tests.txt
tail -3 $OUT/s22_5_tests.txt
bash perf/ab.sh $OUT/ab_llama.txt "new b:.carry/bundles/new" 3 --model llama3-70b-tp8 --batch 33 44 66 88 132 32 --context 8192 32768 65536 131072 > /dev/null
bash perf/ab.sh $OUT/ab_qwen.txt "new b:.carry/bundles/new" 3 --model qwen3-8b --batch 11 1 8 32 --context 8192 32768 65536 131072 > /dev/null
cat $OUT/ab_llama.txt $OUT/ab_qwen.txt > $F; rm $OUT/ab_llama.txt $OUT/ab_qwen.txt
python3 .carry/ab_med.py $F 2>&1 | tail -40
