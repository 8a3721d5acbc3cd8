#!/bin/bash
# session 22, call 4: wide (8-warp) rank-weighted plans with 257-264 CTAs. Call 3 found that
# a full grid of 264 CTAs puts two of the first 132 CTAs (rank 0 by index, weight 3) on 8 SMs
# and two rank-1 ones on 8 others, so those SMs' work is 6:4 instead of 5:5.
# (1) traces at 258-262 CTAs (sm_pairs.py): where does that start?
# (2) each affected shipped plan against one split fewer and the 4-warp plan (3 rounds);
# (3) the full-grid plans with equal rank weights (OSCAR_CUTE_RANK_WEIGHTS=1/1 bundle).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_4.txt
J=/tmp/tr; mkdir -p $J
for args in "129 8:2" "130 8:2" "131 8:2" "37 8:7" "52 8:5" "87 8:3" "65 8:4"; do
  set -- $args
  OSCAR_CUTE_BUNDLE=.carry/bundles/trace python3 perf/trace_decode.py --model llama3-70b-tp8 --batch $1 --context 32768 --plan $2 --out $J/t_$1.json > $J/t_$1.txt 2>&1 || tail -5 $J/t_$1.txt >> $F
  python3 .carry/sm_pairs.py $J/t_$1.json >> $F 2>&1
done
S="python3 perf/split_sweep_graph.py --rounds 3"
for args in "33 8:8 8:7 4:16" "37 8:7 8:6 4:14" "43 8:6 8:5 4:12" "44 8:6 8:5 4:12" "52 8:5 8:4 4:10" "65 8:4 8:3 4:8" "66 8:4 8:3 4:8" "86 8:3 8:2 4:6" "88 8:3 8:2 4:6" "130 8:2 4:4" "132 8:2 4:4"; do
  set -- $args; b=$1; shift
  $S --model llama3-70b-tp8 --batch $b --context 8192 32768 65536 131072 --plans "$@" >> $F 2>&1
done
$S --model qwen3-8b --batch 11 --context 8192 16384 32768 65536 131072 --plans 8:3 8:2 4:6 >> $F 2>&1
echo "# equal rank weights (1/1 bundle), full grids" >> $F
for args in "llama3-70b-tp8 33 8:8" "llama3-70b-tp8 44 8:6" "llama3-70b-tp8 66 8:4" "llama3-70b-tp8 88 8:3" "llama3-70b-tp8 132 8:2" "qwen3-8b 11 8:3" "llama3-70b-tp8 32 8:8" "qwen3-8b 8 8:4"; do
  set -- $args
  OSCAR_CUTE_BUNDLE=.carry/bundles/w11 $S --model $1 --batch $2 --context 8192 32768 65536 131072 --plans $3 2>&1 | sed "s/^round/w11 round/" >> $F
done
grep -E '^(##|round|w11)' $F | tail -3
