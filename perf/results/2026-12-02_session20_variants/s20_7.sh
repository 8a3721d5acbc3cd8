#!/bin/bash
# session 20, call 7: why decode_pair_w8 (qwen3-8b batch 8-16) is slower with unmasked K
# operands although it runs 12.5 fewer SASS per chunk: trace,clk bundles (per-CTA phase
# stamps + the SM clock over each CTA's INT2 loop) of every head_dim-128 build masked
# (clk_m) and unmasked (clk_u), alternating, at qwen3-8b batch 8 / 64K and 128K and batch 32
# / 64K on decode_pair_w8 (OSCAR_CUTE_RING4=0), and llama3-70b-tp8 batch 32 / 128K (decode_w8).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for r in 1 2; do
for m in "qwen3-8b 8 65536" "qwen3-8b 8 131072" "qwen3-8b 32 65536" "llama3-70b-tp8 32 131072"; do
  set -- $m
  for v in clk_m clk_u; do
    echo "=== round $r $v $1 b$2 ctx$3"
    OSCAR_CUTE_RING4=0 OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --clock --model $1 --batch $2 --context $3 2>&1 | grep -v "^ *rank\|warp busy"
  done
done
done > $OUT/s20_trace_clk.txt 2>&1
grep -E "===|call|int2 loop|SM clock|combine|end  " $OUT/s20_trace_clk.txt
