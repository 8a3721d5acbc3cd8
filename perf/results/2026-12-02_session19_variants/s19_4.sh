#!/bin/bash
# session 19, call 4: the producer-warp experiment with 2 / 4 / 8 producer warps per CTA
# (OSCAR_CUTE_WS_WARPS, each serving 8 / n math warps; one producer warp for all 8 was the
# bottleneck in call 3): GPU tests of the merge-CTA build with each, then alternating-round
# timing against the shipped bundle at qwen3-8b batch 1.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for n in 2 4 8; do
  echo "== ws$n"
  OSCAR_CUTE_BUNDLE=$PWD/.carry/bundles/ws$n PYTHONPATH=. timeout 300 python3 -m pytest -m gpu -q -x tests/cute/test_cute_gpu.py -k "merge_ctas or graphs_replayed" 2>&1 | tail -2
done | tee $OUT/s19_ws_tests2.txt
bash perf/ab.sh $OUT/s19_ab_wsn_b1.txt "new b:.carry/bundles/ws2 b:.carry/bundles/ws4 b:.carry/bundles/ws8" 4 --model qwen3-8b --batch 1 --context 8192 32768 65536 131072
