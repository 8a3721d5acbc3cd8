#!/usr/bin/env bash
# SmolLM2-135M served by SGLang on the CPU: BF16 KV cache vs --kv-cache-dtype int2 (plugin),
# plus an independent Hugging Face reference. See perf/sglang_cpu/README.md.
#
#   perf/sglang_cpu/run_all.sh [OUT_DIR]      # default results/sglang/serve_smollm2_cpu
#
# Needs: a venv with sglang 0.5.23 + this repo editable), the checkpoint made by
# perf/sglang_cpu/make_checkpoint.sh in $MODEL (default ./smollm2_hf).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=${1:-results/sglang/serve_smollm2_cpu}
MODEL=${MODEL:-smollm2_hf}
N=${N:-48}
mkdir -p "$OUT" "$OUT/logs"
export PYTHONPATH=$PWD/perf/sglang_cpu/shim${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

run() {  # name, args...
  local name=$1; shift
  echo "== $name: $*"
  local t=$SECONDS
  "$PY" perf/sglang_cpu/serve_compare.py --model "$MODEL" --max-new-tokens "$N" \
      --out "$OUT/$name.json" "$@" > "$OUT/logs/$name.log" 2>&1 \
    || { echo "   FAILED (rc $?), see $OUT/logs/$name.log"; tail -20 "$OUT/logs/$name.log"; return 0; }
  echo "   ok in $((SECONDS - t)) s"
}

# baselines (BF16 KV cache, SGLang's torch_native attention)
run bf16_batch            --kv bf16 --mode batch --self-forced
run bf16_seq              --kv bf16 --mode seq
run bf16_batch_chunk64    --kv bf16 --mode batch --chunked-prefill-size 64
run bf16_radix_seq        --kv bf16 --mode seq --radix --rounds 2
# INT2, sink 4 / recent 32: prompts of 286-320 tokens keep ~250-290 positions in INT2 pages
run int2_batch            --kv int2 --mode batch --self-forced --forced "$OUT/bf16_batch.json"
run int2_seq              --kv int2 --mode seq
run int2_batch_chunk64    --kv int2 --mode batch --chunked-prefill-size 64
run int2_radix_seq        --kv int2 --mode seq --radix --rounds 2
run int2_page16_batch     --kv int2 --mode batch --page-size 16
# plumbing check: a recent window longer than every sequence keeps everything in BF16
run int2_allbf16_batch    --kv int2 --mode batch --sink 4 --recent 512
# the plugin's defaults (sink 64 / recent 256): only positions 64..L-257 are INT2
run int2_default_batch    --kv int2 --mode batch --sink 64 --recent 256 --forced "$OUT/bf16_batch.json"

# independent reference: transformers + oscar_kernels' OscarCache (no SGLang, no plugin)
for kv in bf16 int2; do
  echo "== hf_$kv"
  "$PY" perf/sglang_cpu/hf_reference.py --model "$MODEL" --kv $kv --max-new-tokens "$N" \
      --forced "$OUT/bf16_batch.json" --out "$OUT/hf_$kv.json" > "$OUT/logs/hf_$kv.log" 2>&1 \
    || echo "   FAILED, see $OUT/logs/hf_$kv.log"
done

"$PY" perf/sglang_cpu/compare.py "$OUT" | tee "$OUT/../serve_smollm2_cpu_bf16_vs_int2.txt"
