#!/usr/bin/env bash
# GPU call 12 (H200): workload A's fixed-point integer reduction (REDUCE = fixed) against the
# one-level ticket over a product grid on all 16 suite cases; a race check (500 back-to-back
# calls, same bits); the kernel suite on the GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout 60 python3 docs/benchmarks/run12/stress.py 2>&1 | grep -v -i warn | tee $OUT/stress.log
timeout 200 python3 -m kernels.explore --kernel vision_rope_generation_bwd --grid docs/benchmarks/run12/grid.json \
  --n 20 --out $OUT/explore_a.json 2>&1 | grep -v -i warn | cut -c1-260 > $OUT/explore_a.log
tail -17 $OUT/explore_a.log | cut -c1-100
timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short -n 8 tests/kernels > $OUT/kernel_tests.log 2>&1
tail -3 $OUT/kernel_tests.log
