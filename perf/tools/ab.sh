#!/bin/bash
# A/B timing of CuTe decode builds in alternating rounds (GPU run-to-run noise is 1-2 %,
# so variants are interleaved rather than run back to back).
#
# usage: bash perf/tools/ab.sh OUTFILE "VARIANTS" ROUNDS [perf/cute_bench.py args...]
#   VARIANTS, space separated:
#     new          this tree with its prebuilt bundle
#     b:DIR        this tree with the bundle in DIR (OSCAR_CUTE_BUNDLE=DIR)
#     tree:DIR     the package tree in DIR (e.g. `git archive` of another commit)
#     VAR=VAL@X    variant X with the environment variable VAR set to VAL
# Each round runs `python3 perf/cute_bench.py --backends cute --kv-layout HND
# --rep 20 ARGS` once per variant (CUDA-graph replays, cold L2, median) and prints one line
# of microseconds per variant.
OUTF=$1; VARS=$2; ROUNDS=$3; shift 3
ROOT=$PWD
{ echo "# A/B, alternating rounds; variants: $VARS; python3 perf/cute_bench.py --backends cute --kv-layout HND --rep 20 $*; us"
  echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); date_utc: $(date -u '+%F %T'); commit: ${OSCAR_GIT_COMMIT:-unknown}"
for r in $(seq "$ROUNDS"); do for v in $VARS; do
  unset OSCAR_CUTE_BUNDLE; D=$ROOT
  E=; case $v in *@*) E=${v%%@*}; v=${v#*@};; esac
  case $v in
    b:*) export OSCAR_CUTE_BUNDLE=$ROOT/${v#b:};;
    tree:*) D=$ROOT/${v#tree:};;
  esac
  (cd "$D"; [ -n "$E" ] && export "$E"; PYTHONPATH=. python3 perf/cute_bench.py --backends cute --kv-layout HND --rep 20 "$@" 2>&1) | grep '"model"' | python3 -c "
import sys, json
print('${E:+$E@}$v', ' '.join('%s/b%d/%dK %.1f' % (r['model'][:5], r['batch'], r['context'] // 1024, 1e3 * r.get('cute_ms', 0)) for r in map(json.loads, sys.stdin)))"
done; done; unset OSCAR_CUTE_BUNDLE; } > "$OUTF" 2>&1
cat "$OUTF"
