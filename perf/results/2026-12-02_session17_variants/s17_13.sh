#!/bin/bash
# session 17, call 14-15: GPU tests at the final commits (manifest caching in the bundle loader)
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/cute tests/integrations -q -p no:cacheprovider -rs > $OUT/tests_final.txt 2>&1; tail -4 $OUT/tests_final.txt
