#!/bin/bash
# session 22, call 3: call 2's traces again with the JSON kept and summarized per SM
# (sm_pairs.py: which assumed dispatch ranks share each SM, and when each SM ended).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_3.txt
J=/tmp/tr; mkdir -p $J
for args in "llama3-70b-tp8 32 131072 8:8" "llama3-70b-tp8 33 131072 8:8" "llama3-70b-tp8 128 65536 8:2" "llama3-70b-tp8 132 65536 8:2" "llama3-70b-tp8 44 65536 8:6" "qwen3-8b 8 65536 8:4" "qwen3-8b 33 65536 8:1"; do
  set -- $args
  for rep in 1 2; do
    OSCAR_CUTE_BUNDLE=.carry/bundles/trace python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --plan $4 --out $J/t_$1_$2_$rep.json > $J/t_$1_$2_$rep.txt 2>&1 || tail -5 $J/t_$1_$2_$rep.txt >> $F
    python3 .carry/sm_pairs.py $J/t_$1_$2_$rep.json >> $F 2>&1
  done
done
tar -czf $OUT/s22_3_traces.tgz -C $J .
ls -la $OUT
