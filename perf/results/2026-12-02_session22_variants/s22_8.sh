#!/bin/bash
# session 22, call 8 (no code change): two plan rules suggested by call 7, against the
# shipped shape plans, 8K-128K, 2 alternating rounds (perf/split_sweep_graph.py):
# (A) the wide plan with 72-96 fused-tail rows (WIDE_MAX_ROWS is 64): llama3-70b-tp8 batch
#     21-27 on 8 warps x (264 // batch) splits;
# (B) 4-warp single waves with fewer splits where the busiest SM holds fewer CTAs x share
#     (ceil(CTAs / #SMs) / splits): llama3-70b-tp8 batch 95 / 99 (5 -> 4 splits), qwen3-8b
#     batch 12 (5 -> 4), smollm2 batch 26 (6 -> 5), 30 / 33 (5 -> 4).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_8.txt
while read -r m b plans; do
  timeout 60 python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 2 --context 8192 32768 131072 --plans $plans >> $F 2>&1
done <<'LIST'
llama3-70b-tp8 21 shapes 8:12
llama3-70b-tp8 22 shapes 8:12
llama3-70b-tp8 23 shapes 8:11
llama3-70b-tp8 25 shapes 8:10
llama3-70b-tp8 27 shapes 8:9
llama3-70b-tp8 95 shapes 4:4
llama3-70b-tp8 99 shapes 4:4
qwen3-8b 12 shapes 4:4:r4
smollm2 26 shapes 4:5
smollm2 30 shapes 4:4
smollm2 33 shapes 4:4
LIST
grep -c '^round' $F
