#!/bin/bash
# session 17, call 13: bench_decode's plan column with the launched build (a short run)
export OSCAR_GIT_COMMIT=${C:-unknown}
PYTHONPATH=. timeout 200 python3 perf/bench_decode.py --presets qwen3-8b,llama3-70b-tp8 --batches 1,2,8 --contexts 8192 --baselines "" --rep 5 --warmup 2 --budget 30 --kv-layout HND --out-dir $OUT --stem plan_column 2>&1 | tail -3
grep "^| " $OUT/plan_column.md | awk -F'|' '{print $2,$3,$4,$NF, $(NF-1)}'
