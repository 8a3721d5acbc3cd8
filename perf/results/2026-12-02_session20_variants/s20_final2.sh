#!/bin/bash
# session 20, final 2: GPU tests of this tree (its shipped bundle) and the bench_decode table.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider -rs > $OUT/tests_final.txt 2>&1; tail -4 $OUT/tests_final.txt
python3 .carry/flashinfer/setup_site.py /tmp/fi_site >/dev/null 2>&1
S=2026-12-02_h200_cute_bench_decode_hnd_$C
PYTHONPATH=/tmp/fi_site:. timeout 320 python3 perf/bench_decode.py --presets qwen3-8b,llama3-70b-tp8 --batches 1,8,32,128 --contexts 8192,32768,65536,131072 --baselines flashinfer,flashinfer_fp8 --fi-site /tmp/fi_site --rep 15 --warmup 3 --budget 160 --kv-layout HND --out-dir $OUT --stem $S 2>&1 | tail -2
ls $OUT
