#!/bin/bash
# session 22, call 1 (no code change). A: does a 256-CTA single wave of 8-warp CTAs lose
# the 8 unfilled slots (8 SMs with one CTA)? llama3-70b-tp8 (1 KV head) batch 31 / 32 / 33
# on the same 8 x 8 plan (248 / 256 / 264 CTAs), batch 128 / 132 on 8 x 2 (256 / 264):
# if the 264-CTA grids take about as long as the 256-CTA ones, a grid flattened over all
# 264 slots would gain up to 3 %. B: qwen3-8b 4-warp multi-wave plans (batch 67-256) with
# the 4-deep ring forced on (:r4) and off, 3 alternating rounds, data for a ring rule.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_1.txt
for b in 31 32 33; do
  python3 perf/split_sweep_graph.py --model llama3-70b-tp8 --batch $b --rounds 3 --context 65536 131072 --plans 8:8 >> $F 2>&1
done
for b in 128 132; do
  python3 perf/split_sweep_graph.py --model llama3-70b-tp8 --batch $b --rounds 3 --context 65536 131072 --plans 8:2 >> $F 2>&1
done
for bp in 67:4:4 88:4:3 106:4:1 128:4:1 133:4:2 180:4:1 212:4:1 256:4:1; do
  b=${bp%%:*}; p=${bp#*:}
  sleep 3
  python3 perf/split_sweep_graph.py --model qwen3-8b --batch $b --rounds 3 --context 8192 16384 32768 65536 --plans $p $p:r4 >> $F 2>&1
done
grep '^round' $F | tail -5
