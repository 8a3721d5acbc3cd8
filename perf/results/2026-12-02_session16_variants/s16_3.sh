#!/bin/bash
# session 16, call 3: is qwen3-8b batch 1's INT2 loop bound per SM or globally? (fewer / more splits with merge CTAs), and merge CTAs at batch 8
export OSCAR_GIT_COMMIT=${C:-unknown}
PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 1 --context 32768 65536 131072 --plans auto 8:8:mc 8:12:mc 8:17:mc 8:20:mc --rounds 2 2>&1 | tee $OUT/s16_split_sweep_b1.txt
PYTHONPATH=. python3 perf/split_sweep_graph.py --model qwen3-8b --batch 8 --context 32768 65536 131072 --plans auto 8:4:mc --rounds 3 2>&1 | tee $OUT/s16_split_sweep_b8_mc.txt
OSCAR_CUTE_BUNDLE=.carry/bundles/tracepro PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 65536 --plan 8:8:mc --out $OUT/s16_tracepro_b1_8_8_mc.json 2>&1 | tee $OUT/s16_tracepro_b1_8_8_mc.txt
