#!/bin/bash
# session 23, call 5: GPU tests at HEAD (the WIDE_BUSY_MARGIN / WIDE_SHORT_WARP_TOKENS plans),
# the bench_decode table, and bench_decode at qwen3-8b batch 7 / 9 (the changed plans).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
T0=$(date +%s)
timeout 200 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider -rs > $OUT/tests_gpu.txt 2>&1; tail -3 $OUT/tests_gpu.txt
echo "tests t=$(( $(date +%s) - T0 ))"
python3 .carry/flashinfer/setup_site.py /tmp/fi_site >/dev/null 2>&1
S=2026-12-02_h200_cute_bench_decode_hnd_$C
PYTHONPATH=/tmp/fi_site:. timeout 200 python3 perf/bench_decode.py --presets qwen3-8b,llama3-70b-tp8 --batches 1,8,32,128 --contexts 8192,32768,65536,131072 --baselines flashinfer,flashinfer_fp8 --fi-site /tmp/fi_site --rep 15 --warmup 3 --budget 160 --kv-layout HND --out-dir $OUT --stem $S 2>&1 | tail -2
echo "bench t=$(( $(date +%s) - T0 ))"
S=2026-12-02_h200_cute_bench_decode_hnd_b7_b9_$C
PYTHONPATH=/tmp/fi_site:. timeout 100 python3 perf/bench_decode.py --presets qwen3-8b --batches 7,9 --contexts 8192,32768,65536,131072 --baselines flashinfer,flashinfer_fp8 --fi-site /tmp/fi_site --rep 15 --warmup 3 --budget 160 --kv-layout HND --out-dir $OUT --stem $S 2>&1 | tail -2
echo "bench2 t=$(( $(date +%s) - T0 ))"
ls $OUT
