#!/bin/bash
# session 18, call 6: GPU tests at the session's last kernel-source commit (shipped cubins unchanged), and call 1's shapes again with the text kept (llama3-70b-tp8 b1 64K, b32 128K, qwen3-8b b128 64K; trace / trace,nocons / trace,noload bundles)
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider -rs > $OUT/s18_pytest_gpu_cute_integrations.txt 2>&1; tail -4 $OUT/s18_pytest_gpu_cute_integrations.txt
for m in "llama3-70b-tp8 1 65536" "llama3-70b-tp8 32 131072" "qwen3-8b 128 65536"; do
  set -- $m
  for v in trace trace_nocons trace_noload; do
    echo "=== $v $1 b$2 ctx$3"
    OSCAR_CUTE_BUNDLE=.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --out /tmp/t.json 2>&1 | grep -v "^ *rank\|warp busy"
  done
done > $OUT/s18_trace_loop_parts_call1.txt
grep -E "===|call|int2 loop|end  " $OUT/s18_trace_loop_parts_call1.txt
