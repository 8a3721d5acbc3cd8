#!/bin/bash
# session 22, call 9 (explicit plans, so the tree's plan rule does not matter): call 8 ran
# "shapes" with the busiest-SM rule already in the working tree (so its rows for (B) compare
# a plan with itself). Here old against new split counts, 2 alternating rounds:
# (B) 4-warp single waves, fewer splits: llama3-70b-tp8 batch 95 / 99 4:5 -> 4:4, qwen3-8b
#     batch 12 4:5:r4 -> 4:4:r4, smollm2 batch 26 4:6 -> 4:5, batch 30 / 33 4:5 -> 4:4;
# (A) wide plans with 80 / 72 tail rows: llama3-70b-tp8 batch 26 4:20 -> 8:10, 28 4:18 -> 8:9.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_9.txt
while read -r m b plans; do
  timeout 60 python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 2 --context 8192 32768 131072 --plans $plans >> $F 2>&1
done <<'LIST'
llama3-70b-tp8 95 4:5 4:4
llama3-70b-tp8 99 4:5 4:4
qwen3-8b 12 4:5:r4 4:4:r4
smollm2 26 4:6 4:5
smollm2 30 4:5 4:4
smollm2 33 4:5 4:4
llama3-70b-tp8 26 4:20 8:10
llama3-70b-tp8 28 4:18 8:9
LIST
grep -c '^round' $F
