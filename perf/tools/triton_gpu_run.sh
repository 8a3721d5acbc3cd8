#!/bin/bash
# One device call for the Triton kernels: GPU tests of tests/triton, bench_decode
# (qwen3-8b, FlashInfer BF16 + SDPA in the same run, a config sweep, the shipped default
# reported), then bench_append_extend. Everything lands under $OUT (8 files at most).
# Usage (repo root, device machine):
#   bash perf/tools/triton_gpu_run.sh TAG BATCHES CONTEXTS CONFIGS [extra bench_decode args]
# Env: SKIP_TESTS=1, SKIP_APPEND=1, BENCH_TIMEOUT (s), OSCAR_GIT_COMMIT.
set -o pipefail
TAG=$1; BATCHES=$2; CONTEXTS=$3; CONFIGS=$4; shift 4
export PYTHONPATH=/tmp/fi_site:. FLASHINFER_DISABLE_JIT=1 PYTHONUNBUFFERED=1
export OSCAR_GIT_COMMIT=${OSCAR_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export TRITON_CACHE_DIR=/tmp/tcache
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)";
  python3 .carry/flashinfer/setup_site.py /tmp/fi_site 2>&1 | tail -3; } > $OUT/${TAG}_env.txt 2>&1
if [ -z "$SKIP_TESTS" ]; then
  { echo "# pytest -m gpu tests/triton at $OSCAR_GIT_COMMIT"; echo "date_utc: $(date -u '+%F %T')";
    echo "command: PYTHONPATH=. python3 -m pytest -m gpu -q -rs --durations=12 tests/triton";
    sed -n 2p $OUT/${TAG}_env.txt;
    timeout ${TEST_TIMEOUT:-280} python3 -m pytest -m gpu -q -rs --durations=12 -p no:cacheprovider tests/triton 2>&1; echo "rc=$?"; } \
    | tee $OUT/${TAG}_pytest.log | tail -22
fi
timeout ${BENCH_TIMEOUT:-300} python3 perf/bench_decode.py --presets qwen3-8b --batches $BATCHES --contexts $CONTEXTS \
  --triton-configs "$CONFIGS" --fi-site /tmp/fi_site --out-dir $OUT --stem ${TAG}_bench "$@" 2>&1 \
  | tee $OUT/${TAG}_bench.log | grep -v "^\[profile\]\|^\[row\]\|^\[env\]\|Warn\|warn" | tail -22
if [ -z "$SKIP_APPEND" ]; then
  timeout ${APPEND_TIMEOUT:-150} python3 perf/bench_append_extend.py --out-dir $OUT --stem ${TAG}_append_extend 2>&1 \
    | tee -a $OUT/${TAG}_bench.log | tail -8
fi
find /tmp/tcache -name "*split_kernel*.cubin" -o -name "*merge_kernel*.cubin" -o -name "*quantize_append*.cubin" -o -name "*extend_kernel*.cubin" \
  | head -60 | tar czf $OUT/${TAG}_cubins.tgz -T - 2>/dev/null
ls $OUT
