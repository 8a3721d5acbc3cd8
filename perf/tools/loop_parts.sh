#!/bin/bash
# The INT2 loop's copies alone and its math alone, next to the full kernel
# (docs/cute-design.md): per shape, one CUDA-graph replay of each of three debug bundles
# through perf/trace_decode.py (the shape's own plan), and one line with the call times and the
# median CTA's INT2 loop (us): full / copies only / math only.
#
# usage: bash perf/tools/loop_parts.sh DIR "MODEL BATCH CONTEXT" ["MODEL BATCH CONTEXT" ...]
#   DIR holds the three bundles, built on any machine with the DSL (docs/cute-design.md):
#     for v in trace trace,nocons trace,noload; do
#       CUTE_DSL_ARCH=sm_90a python -m oscar_kernels.cute.aot build --debug $v \
#         --out DIR/${v//,/_} --head-dims 128 --cuda "$CUDA_HOME"; done
#   (nocons: the loop's copies and waits without its math; noload: its math
#   without the copies. Timing only: the results are wrong.)
DIR=$1; shift
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); date_utc: $(date -u '+%F %T'); commit: ${OSCAR_GIT_COMMIT:-unknown}"
for shape in "$@"; do
  set -- $shape
  line="$1 b$2 $(($3 / 1024))K"
  for v in trace trace_nocons trace_noload; do
    out=$(OSCAR_CUTE_BUNDLE=$DIR/$v PYTHONPATH=. timeout 180 python3 perf/trace_decode.py \
          --model $1 --batch $2 --context $3 --out "$DIR/loop_parts_$v.json" 2>&1)
    echo "$out" | sed "s/^/[$v] /" >&2
    call=$(echo "$out" | sed -n 's/.*call \([0-9.]*\) us.*/\1/p' | head -1)
    loop=$(echo "$out" | awk '/int2 loop/ {print $6; exit}')
    line="$line | $v call ${call:-?} loop ${loop:-?}"
  done
  echo "$line"
done
