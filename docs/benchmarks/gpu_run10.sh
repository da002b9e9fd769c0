#!/usr/bin/env bash
# GPU call 10 (H200): the throughput run again (all 32 suite cases, 32 trials each, a scratch
# database: the shipped records stay those of call 8) with every kernel's first cases' configs
# queued on the compile pool at the start; then the tuner's test suite on the GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/ks $OUT/tune
export KS_DATABASE_URL=sqlite:////tmp/ks/kernelsearch.db
python3 -m service.cli db upgrade >/dev/null
timeout 230 python3 -m search_space.efficiency --out $OUT/tune --mode throughput --throughput-trials 32 \
  --budget-s 400 --measure-n 30 --trial-timeout 30 --db $KS_DATABASE_URL 2>&1 | grep -v -i warn | tail -4
python3 -c "import json; t=json.load(open('$OUT/tune/results.json'))['throughput']; print('wall', round(t['wall_s'],1), {k: round(v,1) for k, v in t['phase_s'].items()}, 'other', round(t['other_s'],1))"
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -n 4 tests/search_space/test_tuner.py \
  tests/search_space/test_runner_prefetch.py > $OUT/tuner_tests.log 2>&1
grep -E "^E |FAILED|passed|failed" $OUT/tuner_tests.log | tail -30
