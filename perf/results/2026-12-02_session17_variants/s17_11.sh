#!/bin/bash
# session 17, call 12: split counts of the ring-4 wide pair build at qwen3-8b batch 2-4 (llama's 4-warp decode preferred fewer, longer CTAs with the 4-deep ring)
export OSCAR_GIT_COMMIT=${C:-unknown}
S="PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --rounds 3 --context 8192 32768 65536 131072"
eval $S --batch 2 --plans auto 8:8:r4 8:12:r4 8:16:mc 2>&1 | tee $OUT/s17_sweep_b2.txt | grep ^round
eval $S --batch 3 --plans auto 8:8:r4 8:5:r4 2>&1 | tee $OUT/s17_sweep_b3.txt | grep ^round
eval $S --batch 4 --plans auto 8:6:r4 8:4:r4 2>&1 | tee $OUT/s17_sweep_b4.txt | grep ^round
