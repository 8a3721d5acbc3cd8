#!/bin/bash
# session 23, call 3 (2x H200): the GPU tests with two devices visible (the multi-device
# tests run instead of skipping) and perf/tp_check.py over 2 ranks (NCCL), at the tree's
# commit; first rerun since 1ef23ce / b00adb4.
export OSCAR_GIT_COMMIT=${C:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ date -u; echo "command: PYTHONPATH=. python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/cute tests/integrations"; } > $OUT/pytest_x2.txt
timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/cute tests/integrations >> $OUT/pytest_x2.txt 2>&1
tail -4 $OUT/pytest_x2.txt
timeout 240 python3 perf/tp_check.py --world-size 2 --out $OUT > $OUT/tp_check_log.txt 2>&1
echo "tp_check rc=$?"; tail -12 $OUT/tp_check_log.txt
