#!/usr/bin/env bash
# GPU call 4 (H200): the tuning run whose records the service ships (all 32 suite cases, TPE with
# the kernel's default and the neighbours' bests enqueued first, compile-ahead), the final
# `kernelsearch bench` with those records (eager, torch.compile, default and tuned config per
# case, one run), then a measured table of workload A's configs for the search-efficiency replay.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/ks $OUT/tune
export KS_DATABASE_URL=sqlite:////tmp/ks/kernelsearch.db
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m service.cli db upgrade
timeout 230 python3 -m search_space.efficiency --out $OUT/tune --mode throughput --throughput-trials 20 \
  --budget-s 190 --measure-n 30 --trial-timeout 30 --db $KS_DATABASE_URL 2>&1 | grep -v -i warn | tail -36
python3 -m service.cli records export $OUT/h200_records.json
timeout 170 python3 -m service.cli bench --compare-default --n 30 --json $OUT/bench.json \
  --plot $OUT/bench.png --table $OUT/bench.txt 2>$OUT/bench.err
echo "bench rc=$?"
timeout 120 python3 -m kernels.explore --kernel vision_rope_generation_bwd --n 10 \
  --out $OUT/explore_a.json 2>&1 | grep -v -i warn
