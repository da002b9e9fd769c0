#!/usr/bin/env bash
# GPU call 6 (H200): workload A's two-level ticket and tile prefetch against the one-level ticket,
# over all 16 suite cases (run6/grid.json: a product grid, also the measured table for A's
# search-efficiency replay).
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 400 python3 -m kernels.explore --kernel vision_rope_generation_bwd --grid docs/benchmarks/run6/grid.json \
  --n 20 --out $OUT/explore_a.json 2>&1 | grep -v -i warn | tee $OUT/explore_a.log
