#!/bin/bash
# session 23, call 1 (no code change): qwen3-8b batch 4-16, the shipped plan ("shapes",
# wide at all but 12-13) against the 4-warp single-wave plan with the 4-deep ring (and one
# split fewer), 8K-128K, 3 alternating rounds; perf/split_sweep_graph.py (us).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s23_1.txt
while read -r m b plans; do
  timeout 100 python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 3 --context 8192 32768 65536 131072 --plans $plans >> $F 2>&1
done <<'LIST'
qwen3-8b 8 shapes 4:8:r4 4:8 4:7:r4
qwen3-8b 4 shapes 4:16:r4 4:12:r4
qwen3-8b 5 shapes 4:13:r4 4:12:r4
qwen3-8b 6 shapes 4:11:r4 4:10:r4
qwen3-8b 7 shapes 4:9:r4 4:8:r4
qwen3-8b 9 shapes 4:7:r4 4:6:r4
qwen3-8b 10 shapes 4:6:r4 4:5:r4
qwen3-8b 11 shapes 4:6:r4 4:5:r4
qwen3-8b 14 shapes 4:4:r4 4:3:r4
qwen3-8b 16 shapes 4:4:r4 4:3:r4
LIST
grep -c '^round' $F
