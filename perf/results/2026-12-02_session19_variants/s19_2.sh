#!/bin/bash
# session 19, call 2: the same Nsight Compute warp-state sampling as call 1 (s19_1.sh) for the
# files call 1 could not bring back (its output held too many files): everything in one tar.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/o
for m in "qwen3-8b 1 65536" "qwen3-8b 8 65536" "llama3-70b-tp8 32 131072"; do
  set -- $m
  for v in full nocons noload; do
    tag=$1_b$2_$(($3/1024))k_$v
    [ "$1" = llama3-70b-tp8 ] && [ $v != noload ] && continue
    if [ $v = full ]; then B=oscar_kernels/cute/prebuilt; else B=.carry/bundles/$v; fi
    echo "=== $tag"
    OSCAR_CUTE_BUNDLE=$B OSCAR_CUTE_MODE=bundle PYTHONPATH=. timeout 150 ncu --clock-control none -k 'regex:(?i)int2' \
      --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      -o /tmp/o/s19_ncu_$tag python3 perf/ncu_decode_probe.py $2 $3 $1 HND 2>&1 | tail -1
    ncu -i /tmp/o/s19_ncu_$tag.ncu-rep --page details > /tmp/o/s19_ncu_${tag}_details.txt 2>&1
    ncu -i /tmp/o/s19_ncu_$tag.ncu-rep --page source --csv --print-source sass > /tmp/o/s19_ncu_${tag}_sass.csv 2>&1
    grep -E "SM Frequency|Elapsed Cycles|Duration|Executed Ipc Active" /tmp/o/s19_ncu_${tag}_details.txt
  done
done
tar -czf $OUT/s19_ncu2.tgz -C /tmp/o .
ls -la $OUT
