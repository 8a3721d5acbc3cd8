#!/bin/bash
# session 18, call 3: the software-pipelined INT2 loop (OSCAR_CUTE_PIPE=1 bundle: the next chunk pair's QK issued before this pair's softmax and PV, 8-deep rings) -- GPU tests against it, then alternating rounds against the shipped bundle
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/pipe PYTHONPATH=. timeout 200 python3 -m pytest -m gpu tests/cute -q -p no:cacheprovider -x > $OUT/s18_pipe_tests.txt 2>&1; tail -3 $OUT/s18_pipe_tests.txt
bash perf/ab.sh $OUT/s18_ab_pipe_qwen.txt "new b:.carry/bundles/pipe" 3 --model qwen3-8b --batch 1 2 4 8 32 --context 8192 32768 65536 131072 | tail -6
bash perf/ab.sh $OUT/s18_ab_pipe_llama.txt "new b:.carry/bundles/pipe" 3 --model llama3-70b-tp8 --batch 1 8 32 128 --context 8192 32768 65536 131072 | tail -6
