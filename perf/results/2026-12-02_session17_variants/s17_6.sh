#!/bin/bash
# session 17, call 6: llama3-70b-tp8 4-warp split counts with the 4-deep decode ring (call 5: batch 8 with 33 splits ~1 us faster than the plan's 49)
export OSCAR_GIT_COMMIT=${C:-unknown}
S="PYTHONPATH=. python3 perf/split_sweep_graph.py --model llama3-70b-tp8 --rounds 3 --context 8192 32768 65536 131072"
eval $S --batch 2 --plans auto 4:99 4:66 2>&1 | tee $OUT/s17_sweep_llama_b2.txt
eval $S --batch 4 --plans auto 4:66 4:33 2>&1 | tee $OUT/s17_sweep_llama_b4.txt
eval $S --batch 8 --plans auto 4:33 4:40 4:24 2>&1 | tee $OUT/s17_sweep_llama_b8b.txt
eval $S --batch 12 --plans auto 4:22 4:16 2>&1 | tee $OUT/s17_sweep_llama_b12.txt
eval $S --batch 16 --plans auto 4:16 4:20 2>&1 | tee $OUT/s17_sweep_llama_b16b.txt
