#!/usr/bin/env bash
# GPU call 15 (H200): the tuner's test suite on the GPU again, after call 14's one failure (a
# 0.5 s trial limit that a cold compile of the first config exceeded; the test now allows 3 s).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short -n 4 tests/search_space/test_tuner.py \
  tests/search_space/test_runner_prefetch.py tests/search_space/test_space.py > $OUT/tuner_tests.log 2>&1
grep -E "^E |FAILED|passed|failed" $OUT/tuner_tests.log | tail -15
