#!/bin/bash
# session 23, call 6: several waves of smaller CTAs (the hardware scheduler balancing the
# SMs' dynamic speed differences) against the shipped single waves at three target shapes
# below 80 % / 5x, 32K-128K, 3 alternating rounds; perf/split_sweep_graph.py (us).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s23_6.txt
while read -r m b plans; do
  timeout 150 python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 3 --context 32768 65536 131072 --plans $plans >> $F 2>&1
done <<'LIST'
qwen3-8b 8 shapes 4:16 4:24 4:32 8:8 8:12 8:16
llama3-70b-tp8 32 shapes 8:10 8:16 4:16 4:24
llama3-70b-tp8 128 shapes 8:4 8:6 4:8 4:12
LIST
grep -c '^round' $F
