#!/bin/bash
# session 17, final: GPU tests of this tree, A/B of the plan change (tree_old = f232432: same bundle, 3 CTAs per SM for llama3-70b-tp8 batch 4-12), the bench_decode table, bench_e2e
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider -rs > $OUT/tests_final.txt 2>&1; tail -4 $OUT/tests_final.txt
bash perf/ab.sh $OUT/s17_ab_plan_llama.txt "tree:.carry/tree_old new" 3 --model llama3-70b-tp8 --batch 4 8 12 16 --context 8192 32768 65536 131072 | tail -2
python3 .carry/flashinfer/setup_site.py /tmp/fi_site >/dev/null 2>&1
S=2026-12-02_h200_cute_bench_decode_hnd_$C
PYTHONPATH=/tmp/fi_site:. timeout 300 python3 perf/bench_decode.py --presets qwen3-8b,llama3-70b-tp8 --batches 1,8,32,128 --contexts 8192,32768,65536,131072 --baselines flashinfer,flashinfer_fp8 --fi-site /tmp/fi_site --rep 15 --warmup 3 --budget 160 --kv-layout HND --out-dir $OUT --stem $S 2>&1 | tail -2
PYTHONPATH=/tmp/fi_site:. timeout 240 python3 perf/bench_e2e.py --preset qwen3-8b,qwen3-4b --out-dir $OUT --tag 2026-12-02_h200_e2e_hnd_$C --iters 6 --warmup 2 --int2-also '' --budget-s 130 --int2-kv-layout HND > $OUT/e2e_log.txt 2>&1; tail -3 $OUT/e2e_log.txt
ls $OUT
