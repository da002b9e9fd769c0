#!/usr/bin/env bash
# GPU call 14 (H200): the protocol floors again (per suite case, an empty kernel, a device copy of
# exactly the case's bytes and the kernel's default config, one profiler session per case), now
# that A's default sums with REDUCE=fixed; then the tuner's test suite on the GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout 150 python3 -m kernels.floors --out $OUT/floors.json 2>&1 | grep -v -i warn | tee $OUT/floors.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -n 4 tests/search_space/test_tuner.py \
  tests/search_space/test_runner_prefetch.py tests/search_space/test_space.py > $OUT/tuner_tests.log 2>&1
grep -E "^E |FAILED|passed|failed" $OUT/tuner_tests.log | tail -15
