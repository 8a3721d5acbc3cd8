#!/bin/bash
# session 21, call 3: the length hint's plans (auto: max_kv_len = the context) against the
# shape-only plans (shapes), every batch whose plan the hint changes, 2K-64K
# (perf/split_sweep_graph.py: CUDA-graph replay, cold L2, median, alternating rounds).
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
T0=$(date +%s)
F=$OUT/s21_hint_ab.txt
sw() { local m=$1 b=$2; shift 2; echo "## $m batch $b" >> $F; python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 3 --plans shapes auto --context "$@" >> $F 2>&1; }
for b in 2 3 4 5 6 7 8 10 12 16; do sw qwen3-8b $b 2048 4096 8192 16384 32768 65536; done
for b in 24 48; do sw qwen3-8b $b 2048 4096 8192 16384 32768; done
sw qwen3-8b 128 2048 4096 8192
echo "qwen t=$(( $(date +%s) - T0 ))"
for b in 2 3 4 5 7; do sw llama3-70b-tp8 $b 2048 8192 16384 32768 65536 131072; done
for b in 32 48 64 128; do sw llama3-70b-tp8 $b 2048 4096 8192 16384; done
echo "llama t=$(( $(date +%s) - T0 ))"
for b in 1 5 8 12 16 24 32; do sw smollm2 $b 2048 4096 8192 16384 32768 65536; done
echo "smol t=$(( $(date +%s) - T0 ))"
grep -E "^## |^round 2|round 1" $F | head -0
python3 - $F <<'PY'
import sys, re, collections
cur=None; t=collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('## '): cur=line[3:].strip(); continue
    m=re.match(r'round \d+ \S+ b\d+ (\S+): (.*)', line)
    if m:
        vals=re.findall(r'(\d+)K ([\d.]+)', m.group(2))
        for k,v in vals: t[(cur,k,m.group(1))].append(float(v))
keys=sorted({(c,k) for c,k,_ in t}, key=lambda x:(x[0],int(x[1])))
for c,k in keys:
    a=sorted(t[(c,k,'shapes')]); b=sorted(t[(c,k,'auto')])
    if a and b: print(f"{c:28s} {k:>4s}K shapes {a[len(a)//2]:7.1f} hint {b[len(b)//2]:7.1f} {100*(b[len(b)//2]/a[len(a)//2]-1):+5.1f}%")
PY
