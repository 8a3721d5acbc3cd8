#!/bin/bash
# session 21, call 4: GPU tests of this tree; the final length-hint rule against the shapes'
# plans where it differs from call 3's rule (and where it no longer applies); the
# bench_decode table (the context as the CuTe plan's length hint).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
T0=$(date +%s)
timeout 200 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider -rs > $OUT/tests_gpu.txt 2>&1; tail -3 $OUT/tests_gpu.txt
echo "tests t=$(( $(date +%s) - T0 ))"
F=$OUT/s21_hint_ab2.txt
sw() { local m=$1 b=$2; shift 2; echo "## $m batch $b" >> $F; python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 3 --plans shapes auto --context "$@" >> $F 2>&1; }
sw qwen3-8b 10 2048 4096 8192
sw qwen3-8b 12 2048 4096
sw llama3-70b-tp8 3 32768 65536
sw llama3-70b-tp8 4 32768
sw smollm2 8 4096 16384
sw smollm2 24 2048 4096
echo "ab t=$(( $(date +%s) - T0 ))"
python3 .carry/ab_summary.py $F
python3 .carry/flashinfer/setup_site.py /tmp/fi_site >/dev/null 2>&1
S=2026-12-02_h200_cute_bench_decode_hnd_$C
PYTHONPATH=/tmp/fi_site:. timeout 330 python3 perf/bench_decode.py --presets qwen3-8b,llama3-70b-tp8 --batches 1,8,32,128 --contexts 8192,32768,65536,131072 --baselines flashinfer,flashinfer_fp8 --fi-site /tmp/fi_site --rep 15 --warmup 3 --budget 160 --kv-layout HND --out-dir $OUT --stem $S 2>&1 | tail -2
echo "bench t=$(( $(date +%s) - T0 ))"
ls $OUT
