#!/bin/bash
# session 17, call 4: plans with the ring-4 builds at qwen3-8b batch 1 and 8 (the targets left: 3x at batch 1 / 64K, 80 % at batch 8 / 32K-64K)
export OSCAR_GIT_COMMIT=${C:-unknown}
PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 1 --context 32768 65536 131072 --plans auto 8:16:r4 8:24:mc 8:32:mc 4:32:r4 4:32 --rounds 3 2>&1 | tee $OUT/s17_sweep_b1.txt
PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 8 --context 32768 65536 --plans auto 8:4:r4 4:8:r4 4:8 4:4:r4 --rounds 3 2>&1 | tee $OUT/s17_sweep_b8.txt
