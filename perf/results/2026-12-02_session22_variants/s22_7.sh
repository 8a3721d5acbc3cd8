#!/bin/bash
# session 22, call 7 (no code change): the shipped shape plans ("shapes", no length hint)
# against one split fewer / more and the other CTA width's plan, at batch sizes between the
# benchmark's, 32K and 128K, 2 alternating rounds (looking for >= 3 % misses like the
# full-wave one of calls 1-5); perf/split_sweep_graph.py.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=.
F=$OUT/s22_7.txt
while read -r m b plans; do
  timeout 60 python3 perf/split_sweep_graph.py --model $m --batch $b --rounds 2 --context 32768 131072 --plans $plans >> $F 2>&1
done <<'LIST'
llama3-70b-tp8 16 shapes 4:23 4:25 8:16
llama3-70b-tp8 24 shapes 4:21 4:23 8:11
llama3-70b-tp8 29 shapes 4:17 4:19 8:9
llama3-70b-tp8 30 shapes 8:7 8:9 4:17
llama3-70b-tp8 48 shapes 8:4 8:6 4:11
llama3-70b-tp8 67 shapes 4:6 4:8 8:16
llama3-70b-tp8 70 shapes 4:6 4:8 8:16
llama3-70b-tp8 89 shapes 4:4 4:6 8:12
llama3-70b-tp8 100 shapes 4:4 4:6 8:11
llama3-70b-tp8 133 shapes 4:15 4:17 8:8
llama3-70b-tp8 141 shapes 4:2 4:4 8:8
llama3-70b-tp8 160 shapes 4:2 4:4 8:7
llama3-70b-tp8 177 shapes 4:11 4:13 8:6
llama3-70b-tp8 200 shapes 4:10 4:12 8:6
llama3-70b-tp8 212 shapes 8:2 4:2
llama3-70b-tp8 256 shapes 8:2 4:2
qwen3-8b 5 shapes 8:5:r4 8:7:r4 4:13:r4
qwen3-8b 7 shapes 8:3 8:5:r4 4:9:r4
qwen3-8b 9 shapes 8:2 8:4 4:7:r4
qwen3-8b 12 shapes 4:4:r4 4:6 8:11:r4
qwen3-8b 14 shapes 8:1:r4 8:3 4:4:r4
qwen3-8b 17 shapes 4:15 4:17 8:8:r4
qwen3-8b 18 shapes 4:2:r4 4:4 8:8:r4
qwen3-8b 20 shapes 4:2:r4 4:4 8:7:r4
qwen3-8b 23 shapes 4:11 4:13 8:6:r4
qwen3-8b 24 shapes 4:10 4:12 8:6:r4
qwen3-8b 27 shapes 8:2 4:2:r4
qwen3-8b 34 shapes 4:7 4:9 8:4
qwen3-8b 44 shapes 4:5 4:7 8:3
qwen3-8b 53 shapes 4:2 8:1:r4
qwen3-8b 60 shapes 4:2 8:1:r4
LIST
grep -c '^round' $F
