#!/usr/bin/env bash
# GPU call 11 (H200): workload A's L2 prefetch of the ticket counter, partial row and output
# (WARM = l2 against none) over a product grid on all 16 suite cases; then the tuning run whose
# records the service ships (all 32 cases, 32 trials each), the records export, the final
# `kernelsearch bench` with those records, and the kernel suite on the GPU. It ran on the tree of
# commit af63f14 plus run11/warm.patch (the WARM parameter, withdrawn after this run) and a WARM
# parameter in the space file; its records were not shipped.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/ks $OUT/tune
export KS_DATABASE_URL=sqlite:////tmp/ks/kernelsearch.db
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 150 python3 -m kernels.explore --kernel vision_rope_generation_bwd --grid docs/benchmarks/run11/grid.json \
  --n 20 --out $OUT/explore_a.json 2>&1 | grep -v -i warn | cut -c1-220 > $OUT/explore_a.log
tail -17 $OUT/explore_a.log | cut -c1-110
python3 -m service.cli db upgrade >/dev/null
timeout 230 python3 -m search_space.efficiency --out $OUT/tune --mode throughput --throughput-trials 32 \
  --budget-s 400 --measure-n 30 --trial-timeout 30 --db $KS_DATABASE_URL 2>&1 | grep -v -i warn | tail -3
python3 -m service.cli records export $OUT/h200_records.json
timeout 150 python3 -m service.cli bench --compare-default --n 30 --json $OUT/bench.json \
  --plot $OUT/bench.png --table $OUT/bench.txt 2>$OUT/bench.err
echo "bench rc=$?"
grep mean $OUT/bench.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider --tb=short -n 8 tests/kernels > $OUT/kernel_tests.log 2>&1
tail -3 $OUT/kernel_tests.log
