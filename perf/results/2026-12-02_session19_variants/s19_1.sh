#!/bin/bash
# session 19, call 1: Nsight Compute warp-state sampling (per SASS instruction) of the INT2 decode
# kernel, full vs nocons (loop copies only) vs noload (loop math only), at the three shapes whose
# #4 targets need better copy/math overlap. Where do the full kernel's extra stalls sit?
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
which ncu; ncu --version | tail -1
for m in "qwen3-8b 1 65536" "qwen3-8b 8 65536" "llama3-70b-tp8 32 131072"; do
  set -- $m
  for v in full nocons noload; do
    tag=$1_b$2_$(($3/1024))k_$v
    if [ $v = full ]; then B=oscar_kernels/cute/prebuilt; else B=.carry/bundles/$v; fi
    echo "=== $tag"
    OSCAR_CUTE_BUNDLE=$B OSCAR_CUTE_MODE=bundle PYTHONPATH=. timeout 150 ncu --clock-control none -k 'regex:(?i)int2' \
      --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy \
      -o $OUT/s19_ncu_$tag python3 perf/ncu_decode_probe.py $2 $3 $1 HND 2>&1 | tail -3
    ncu -i $OUT/s19_ncu_$tag.ncu-rep --page details > $OUT/s19_ncu_${tag}_details.txt 2>&1
    ncu -i $OUT/s19_ncu_$tag.ncu-rep --page source --csv --print-source sass > $OUT/s19_ncu_${tag}_sass.csv 2>&1
    grep -i "duration\|warp cycles per issued\|issued ipc\|stall" $OUT/s19_ncu_${tag}_details.txt | head -12
    ls -la $OUT/s19_ncu_${tag}*
  done
done
