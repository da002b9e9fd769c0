#!/usr/bin/env bash
# GPU call 3 (H200): tune all 32 suite cases in one run (TPE with warm start, compile-ahead),
# export the records the service ships, then one `kernelsearch bench` run with those records
# (eager, torch.compile, default config and tuned config per case, same run). Results in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/ks $OUT/tune
export KS_DATABASE_URL=sqlite:////tmp/ks/kernelsearch.db
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 30 python3 -m pytest tests/kernels -q -m gpu -p no:cacheprovider --confcutdir=tests/kernels 2>&1 | tail -3
python3 -m service.cli db upgrade
timeout 300 python3 -m search_space.efficiency --out $OUT/tune --mode throughput --throughput-trials 16 \
  --budget-s 260 --measure-n 30 --trial-timeout 30 --db $KS_DATABASE_URL 2>&1 | grep -v -i warn | tail -40
python3 -m service.cli records export $OUT/h200_records.json
timeout 250 python3 -m service.cli bench --compare-default --n 30 --json $OUT/bench.json \
  --plot $OUT/bench.png --table $OUT/bench.txt 2>$OUT/bench.err
echo "bench rc=$?"; tail -2 $OUT/bench.err
