#!/bin/bash
# session 15, call 5: the trace's merge-CTA rows (validation), and what the split merge costs at batch 8-128 now (debug bundles dbg_merge: ticket, no merge work; dbg_tail: no ticket, no merge; timing only, results wrong)
export OSCAR_GIT_COMMIT=${C:-unknown}
OSCAR_CUTE_BUNDLE=.carry/bundles/trace PYTHONPATH=. python3 perf/trace_decode.py --model qwen3-8b --batch 1 --context 65536 2>&1 | tee $OUT/s15_trace_mc2.txt
bash perf/ab.sh $OUT/s15_ab_phase_qwen.txt "new b:.carry/bundles/dbg_merge b:.carry/bundles/dbg_tail" 3 --model qwen3-8b --batch 8 --context 32768 65536
bash perf/ab.sh $OUT/s15_ab_phase_llama.txt "new b:.carry/bundles/dbg_merge b:.carry/bundles/dbg_tail" 3 --model llama3-70b-tp8 --batch 32 128 --context 65536 131072
