#!/bin/bash
# session 15, call 6: GPU tests at the final host code (launch_op refactor), the two perf scripts once
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=. timeout 420 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/s15_pytest_gpu.txt
PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 1 --context 65536 --plans auto 8:16 --rounds 1 2>&1 | tail -4
OSCAR_CUTE_BUNDLE=.carry/bundles/trace PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 65536 2>&1 | grep -E "merge CTA|call" 
