#!/usr/bin/env bash
# GPU call 5 (H200): where the time goes, and the new tilings.
# 1. kernels.floors: per suite case, an empty kernel, a device copy of exactly the case's bytes and
#    the kernel's default config, timed in one profiler session (the protocol's own floor).
# 2. kernels.explore over run5/grid.json: workload B's persistent grid with 8-32 programs per SM,
#    and workload A's new split64 tiling against quarters/pad128 on 6 cases (also the measured
#    table for A's search-efficiency replay).
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 100 python3 -m kernels.floors --out $OUT/floors.json 2>&1 | grep -v -i warn | tee $OUT/floors.txt
timeout 150 python3 -m kernels.explore --kernel vision_rope3d_spatial_merge_bwd --grid docs/benchmarks/run5/grid.json \
  --n 20 --out $OUT/explore_b.json 2>&1 | grep -v -i warn | tee $OUT/explore_b.log
timeout 300 python3 -m kernels.explore --kernel vision_rope_generation_bwd --grid docs/benchmarks/run5/grid.json \
  --case 6 --case 2 --case 8 --case 4 --case 7 --case 1 --n 10 --out $OUT/explore_a.json 2>&1 \
  | grep -v -i warn | tee $OUT/explore_a.log
