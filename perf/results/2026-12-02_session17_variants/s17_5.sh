#!/bin/bash
# session 17, call 5: llama3-70b-tp8 (GQA 8) plans now that decode / decode_w8 have a 4-deep ring (the plan's 4- vs 8-warp choice was measured with 8 stages)
export OSCAR_GIT_COMMIT=${C:-unknown}
S="PYTHONPATH=. python3 perf/split_sweep_graph.py --model llama3-70b-tp8 --rounds 3"
eval $S --batch 1 --context 32768 65536 131072 --plans auto 4:64 4:96 8:16 2>&1 | tee $OUT/s17_sweep_llama_b1.txt
eval $S --batch 8 --context 32768 65536 131072 --plans auto 4:33 4:66 8:16 8:12 2>&1 | tee $OUT/s17_sweep_llama_b8.txt
eval $S --batch 16 --context 32768 65536 131072 --plans auto 4:33 8:8 8:16 2>&1 | tee $OUT/s17_sweep_llama_b16.txt
eval $S --batch 32 --context 32768 65536 131072 --plans auto 8:16 4:16 4:8 2>&1 | tee $OUT/s17_sweep_llama_b32.txt
