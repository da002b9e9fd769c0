#!/usr/bin/env bash
# GPU call 16 (H200): the tuning run whose records the service ships (all 32 suite cases in one
# run, TPE with the kernel's default and the neighbours' bests and the space files' seeds enqueued first, compile-ahead pool
# started before the first case), then the final `kernelsearch bench` with those records
# (eager, torch.compile, default and tuned config per case, one run), then the kernel suite on
# the GPU. Same command as call 13, rerun after a refactor of A's workspace (same SASS) so that the
# shipped records carry the source hash of the code as it lands.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/ks $OUT/tune
export KS_DATABASE_URL=sqlite:////tmp/ks/kernelsearch.db
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m service.cli db upgrade
timeout 430 python3 -m search_space.efficiency --out $OUT/tune --mode throughput --throughput-trials 32 \
  --budget-s 400 --measure-n 30 --trial-timeout 30 --db $KS_DATABASE_URL 2>&1 | grep -v -i warn | tail -40
python3 -m service.cli records export $OUT/h200_records.json
timeout 150 python3 -m service.cli bench --compare-default --n 30 --json $OUT/bench.json \
  --plot $OUT/bench.png --table $OUT/bench.txt 2>$OUT/bench.err
echo "bench rc=$?"
cat $OUT/bench.txt | grep mean
timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short -n 8 tests/kernels > $OUT/kernel_tests.log 2>&1
tail -3 $OUT/kernel_tests.log
