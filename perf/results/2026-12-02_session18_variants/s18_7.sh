#!/bin/bash
# session 18, call 7: perf/loop_parts.sh (the new tool) at qwen3-8b batch 1 / 64K and llama3-70b-tp8 batch 32 / 128K
export OSCAR_GIT_COMMIT=${C:-unknown}
bash perf/loop_parts.sh .carry/bundles "qwen3-8b 1 65536" "llama3-70b-tp8 32 131072" 2> $OUT/loop_parts_stderr.txt | tee $OUT/loop_parts.txt
