#!/bin/bash
# session 22, call 2: why 264 wide CTAs took 12-20 % longer than 256 (call 1). Traces
# (OSCAR_CUTE_DEBUG=trace bundle of this commit) of llama3-70b-tp8 batch 32 / 33 on 8 x 8
# and qwen3-8b batch 32 / 33 on 8 x 1: CTAs per SM and late CTA starts. Then timings of the
# shipped plans with 257-264 wide CTAs against neighbours (3 alternating rounds).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_2.txt
J=/tmp/tr; mkdir -p $J
summ() {
python3 - "$1" <<'PY' >> $F
import json, sys, collections
for r in json.load(open(sys.argv[1])):
    cnt = collections.Counter(r["CTAs per SM"])
    st = sorted(c[0] for c in r["per CTA stamps us"])
    late = [round(x, 1) for x in st if x > 2.0]
    print(f"## {r['model']} b{r['batch']} ctx {r['context']} plan {r['plan']}: {r['ctas']} CTAs, "
          f"call {r['event_us']:.1f} us, SMs used {sum(1 for x in r['CTAs per SM'] if x)}, "
          f"CTAs-per-SM histogram {dict(sorted(cnt.items()))}, starts > 2 us: {len(late)} {late[:24]}")
    print(f"   end {r['end']}, idle {r['SM idle before the last CTA ends']}")
PY
}
for args in "llama3-70b-tp8 32 131072 8:8" "llama3-70b-tp8 33 131072 8:8" "qwen3-8b 32 65536 8:1" "qwen3-8b 33 65536 8:1" "llama3-70b-tp8 132 65536 8:2" "qwen3-8b 3 65536 8:11"; do
  set -- $args
  OSCAR_CUTE_BUNDLE=.carry/bundles/trace python3 perf/trace_decode.py --model $1 --batch $2 --context $3 --plan $4 --out $J/t_$1_$2.json > $J/t_$1_$2.txt 2>&1 || tail -5 $J/t_$1_$2.txt >> $F
  summ $J/t_$1_$2.json
  grep -E "call|start|int2 loop  |end " $J/t_$1_$2.txt | head -6 >> $F
done
S="python3 perf/split_sweep_graph.py --rounds 3"
$S --model qwen3-8b --batch 32 --context 8192 32768 65536 --plans 8:1:r4 >> $F 2>&1
$S --model qwen3-8b --batch 33 --context 8192 32768 65536 --plans 8:1:r4 4:1:r4 4:2 >> $F 2>&1
$S --model qwen3-8b --batch 3 --context 8192 32768 65536 131072 --plans 8:11:r4 8:10:r4 8:8:r4 >> $F 2>&1
$S --model qwen3-8b --batch 11 --context 8192 32768 65536 131072 --plans 8:3 8:2 4:6 >> $F 2>&1
$S --model llama3-70b-tp8 --batch 33 --context 32768 65536 131072 --plans 8:8 8:7 >> $F 2>&1
$S --model llama3-70b-tp8 --batch 132 --context 32768 65536 131072 --plans 8:2 4:4 >> $F 2>&1
$S --model llama3-70b-tp8 --batch 44 --context 32768 65536 131072 --plans 8:6 8:5 >> $F 2>&1
grep -E '^(##|round)' $F | tail -3
