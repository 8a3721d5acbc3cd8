#!/bin/bash
# session 23, call 4: the WIDE_BUSY_MARGIN plans (4-warp single waves, 320025f) at short
# contexts with the length hint ("auto": 4 x 9 / 4 x 7 with the 4-deep ring) against what
# the hint planned before (the wide plan with the 4-deep ring, which the hint takes up to a
# warp's 1024 tokens), 2K-32K, 3 alternating rounds: qwen3-8b and llama2-7b-tp4 batch 7 / 9.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s23_4.txt
while read -r m b plans; do
  timeout 100 python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 3 --context 2048 4096 8192 16384 32768 --plans $plans >> $F 2>&1
done <<'LIST'
qwen3-8b 7 auto 8:4:r4 8:4
qwen3-8b 9 auto 8:3:r4 8:3
llama2-7b-tp4 7 auto 8:4:r4 8:4
llama2-7b-tp4 9 auto 8:3:r4 8:3
LIST
grep -c '^round' $F
