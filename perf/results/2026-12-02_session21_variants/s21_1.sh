#!/bin/bash
# session 21, call 1: the ring depth by length. Each pair plan with the 4-deep ring build
# forced on (:r4) and off, qwen3-8b at the batches whose shape-only rule keeps 8 stages
# (8 warps x 2-4 splits; 4 warps in several waves) and the wide build in several waves, at
# 8K-128K (perf/split_sweep_graph.py: CUDA-graph replay, cold L2, median, alternating rounds).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
S="python3 perf/split_sweep_graph.py --model qwen3-8b --rounds 3"
CT="8192 16384 32768 49152 65536 98304 131072"
export PYTHONPATH=.
T0=$(date +%s)
$S --batch 8 --context $CT --plans 8:4 8:4:r4 > $OUT/s21_ring_b8.txt 2>&1; tail -3 $OUT/s21_ring_b8.txt; echo "t=$(( $(date +%s) - T0 ))"
$S --batch 10 --context $CT --plans 8:3 8:3:r4 > $OUT/s21_ring_b10.txt 2>&1; tail -2 $OUT/s21_ring_b10.txt; echo "t=$(( $(date +%s) - T0 ))"
$S --batch 16 --context $CT --plans 8:2 8:2:r4 > $OUT/s21_ring_b16.txt 2>&1; tail -2 $OUT/s21_ring_b16.txt; echo "t=$(( $(date +%s) - T0 ))"
$S --batch 24 --context $CT --plans 4:11 4:11:r4 > $OUT/s21_ring_b24.txt 2>&1; tail -2 $OUT/s21_ring_b24.txt; echo "t=$(( $(date +%s) - T0 ))"
$S --batch 48 --context $CT --plans 4:6 4:6:r4 > $OUT/s21_ring_b48.txt 2>&1; tail -2 $OUT/s21_ring_b48.txt; echo "t=$(( $(date +%s) - T0 ))"
$S --batch 128 --context 8192 32768 65536 98304 131072 --plans 4:1 4:1:r4 8:1 8:1:r4 > $OUT/s21_ring_b128.txt 2>&1; tail -4 $OUT/s21_ring_b128.txt; echo "t=$(( $(date +%s) - T0 ))"
$S --batch 64 --context 8192 32768 65536 98304 131072 --plans 4:1:r4 8:1 8:1:r4 > $OUT/s21_ring_b64.txt 2>&1; tail -3 $OUT/s21_ring_b64.txt; echo "t=$(( $(date +%s) - T0 ))"
