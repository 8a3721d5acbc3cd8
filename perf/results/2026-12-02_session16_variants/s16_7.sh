#!/bin/bash
# session 16, call 8: GPU tests with per-capture tickets (concurrent graph replays), and the capture probe
export OSCAR_GIT_COMMIT=${C:-unknown}
PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/tests.txt
PYTHONPATH=. timeout 120 python3 perf/graph_capture_probe.py --model qwen3-8b --batch 1 8 --context 65536 --rounds 2 2>&1 | tail -3 | tee $OUT/probe.txt
