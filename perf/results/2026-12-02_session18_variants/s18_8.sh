#!/bin/bash
# session 18, call 8: the SM clock over each CTA's INT2 loop (OSCAR_CUTE_DEBUG=trace,clk bundles: %clock64 / %globaltimer) in the full kernel, copies only (nocons) and math only (noload) -- is the overlap loss a lower clock?
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
for m in "qwen3-8b 1 65536" "qwen3-8b 8 65536" "llama3-70b-tp8 32 131072" "llama3-70b-tp8 128 65536" "qwen3-8b 128 65536"; do
  set -- $m
  for v in trace_clk trace_clk_nocons trace_clk_noload; do
    echo "=== $v $1 b$2 ctx$3"
    OSCAR_CUTE_BUNDLE=.carry/bundles/$v PYTHONPATH=. timeout 120 python3 perf/trace_decode.py --clock --model $1 --batch $2 --context $3 --out /tmp/t.json 2>&1 | grep -v "^ *rank\|warp busy"
  done
done > $OUT/s18_trace_clock.txt
grep -E "===|call|int2 loop|SM clock" $OUT/s18_trace_clock.txt
