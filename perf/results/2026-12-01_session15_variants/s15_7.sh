#!/bin/bash
# session 15, call 7: the merge CTA's poll interval (MERGER_SLEEP_NS 100 shipped; 20; 0 = no nanosleep, which ptxas allocates differently: 56 B stack, main loop 148.5 SASS/chunk)
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s15_ab_sleep_b1.txt "new b:.carry/bundles/sleep20 b:.carry/bundles/sleep0" 5 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072
