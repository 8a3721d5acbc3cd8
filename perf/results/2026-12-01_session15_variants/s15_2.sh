#!/bin/bash
# session 15, call 2: batch-1 plans (splits, merge CTAs) timed like the benchmark
export OSCAR_GIT_COMMIT=${C:-unknown}
PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 1 --context 32768 65536 131072 --plans auto 8:32:mc 8:24:mc 8:16 8:32 --rounds 3 2>&1 | tee $OUT/s15_split_sweep_qwen_b1.txt
PYTHONPATH=. python3 perf/split_sweep_graph.py --model llama3-70b-tp8 --batch 1 --context 65536 131072 --plans auto 4:64 4:32 8:8 8:16 --rounds 3 2>&1 | tee $OUT/s15_split_sweep_llama_b1.txt
