#!/bin/bash
# session 21, call 8 (data for a later rule, no code change): qwen3-8b batch 128 (4 warps x 1
# split, two waves) with the 4-deep ring forced on (:r4) and off, one context per process,
# 5 alternating rounds, 10 s rest between contexts (call 1's rounds were power-capped)
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s21_ring_b128_quiet.txt
for c in 8192 16384 32768 65536 131072; do
  sleep 10
  python3 perf/split_sweep_graph.py --model qwen3-8b --batch 128 --rounds 5 --context $c --plans 4:1 4:1:r4 >> $F 2>&1
done
grep '^round' $F
