#!/bin/bash
# session 21, call 2: plans at short contexts (4K-32K), where a length hint could choose
# fewer splits or the 4-deep ring (perf/split_sweep_graph.py, alternating rounds).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
CT="4096 8192 16384 32768"
T0=$(date +%s)
sw() { local m=$1 b=$2; shift 2; python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 3 --context $CT --plans "$@" > $OUT/s21_short_${m:0:5}_b$b.txt 2>&1; grep '^round 2' $OUT/s21_short_${m:0:5}_b$b.txt; echo "t=$(( $(date +%s) - T0 ))"; }
sw qwen3-8b 1 8:16:mc 8:12:mc 8:8:mc 8:4:mc 8:8:r4 8:4:r4
sw qwen3-8b 2 8:16:r4 8:12:r4 8:8:r4 8:4:r4
sw qwen3-8b 3 8:11:r4 8:8:r4 8:5:r4 8:3:r4
sw qwen3-8b 4 8:8:r4 8:6:r4 8:4:r4 8:2:r4
sw qwen3-8b 8 8:4 8:4:r4 8:3:r4 8:2:r4
sw qwen3-8b 16 8:2 8:2:r4 8:1:r4
sw llama3-70b-tp8 1 4:128 4:64 4:32 4:16 8:16
sw llama3-70b-tp8 4 4:66 4:33 4:16
sw llama3-70b-tp8 8 4:33 4:16 4:8 8:8
sw llama3-70b-tp8 32 8:8 8:6 8:4 8:2
sw llama3-70b-tp8 128 8:2 8:1 4:4
