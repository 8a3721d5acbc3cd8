#!/bin/bash
# session 17, call 11: the ring-4 pair build at the qwen3-8b batches its rule covers but nobody measured (3: 11 wide splits; 12-13: one wave of 4-warp CTAs, 5 splits) and two it leaves out (5-6: 6 / 5 wide splits), forced on and off
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/ab.sh $OUT/s17_ab_ring4_qwen_mid.txt "OSCAR_CUTE_RING4=0@new OSCAR_CUTE_RING4=1@new" 3 --model qwen3-8b --batch 3 5 6 12 13 --context 8192 32768 65536 131072 | tail -2
