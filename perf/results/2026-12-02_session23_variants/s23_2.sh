#!/bin/bash
# session 23, call 2: (A) the wide single wave against the 4-warp single wave where the
# latter's busiest SM holds >= 10 % less (explicit plans, old first), 8K-128K, 3 alternating
# rounds: llama3-70b-tp8 (GQA 8) batch 54 / 58 (8:4 vs 4:9), 72 (8:3 vs 4:7), 76 / 79 (8:3 vs
# 4:5, exactly 10 %), llama2-7b-tp4 (MHA, 8 KV heads) batch 7 / 9; qwen3-8b batch 6 (9 %,
# stays wide) once more. (B) pytest -m gpu tests/cute tests/integrations with the tree's plans.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s23_2.txt
while read -r m b plans; do
  timeout 100 python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 3 --context 8192 32768 65536 131072 --plans $plans >> $F 2>&1
done <<'LIST'
llama3-70b-tp8 54 8:4 4:9
llama3-70b-tp8 58 8:4 4:9
llama3-70b-tp8 72 8:3 4:7
llama3-70b-tp8 76 8:3 4:5
llama3-70b-tp8 79 8:3 4:5
llama2-7b-tp4 7 8:4 4:9:r4
llama2-7b-tp4 9 8:3 4:7:r4
qwen3-8b 6 8:5:r4 4:11:r4
LIST
grep -c '^round' $F
timeout 300 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1
tail -3 $OUT/pytest_gpu.txt
