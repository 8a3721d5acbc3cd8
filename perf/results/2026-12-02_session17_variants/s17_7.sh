#!/bin/bash
# session 17, call 8: is the e2e INT2 attention at batch 32-50 / 100K slower than at 1bebe03 (+8 % in the final run) or was that GPU slower? kernel A/B and e2e (INT2 only) of both trees in alternating rounds
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s17_ab_1bebe03_qwen.txt "tree:.carry/tree_1bebe03 new" 3 --model qwen3-8b --batch 8 32 50 --context 100000 | tail -2
E="--preset qwen3-8b --caches int2 --latency-ctx 100000 --tput-batches 8,32,max --no-check --no-plot --int2-also '' --iters 6 --warmup 2 --int2-kv-layout HND"
for r in 1 2; do for t in .carry/tree_1bebe03 .; do
  (cd $t && eval PYTHONPATH=. timeout 150 python3 perf/bench_e2e.py $E) > $OUT/e2e_${r}_$(basename $t).txt 2>&1
  echo "round $r tree $t"; grep -E "^\| int2 \|" $OUT/e2e_${r}_$(basename $t).txt | head -5
done; done
