#!/usr/bin/env bash
# GPU call 2 (H200): exploration sweep of both kernels over all suite cases, then the first
# `kernelsearch bench` with default configs. Run from the repo root on the GPU machine with the
# carried wheels in .whl/; results land in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 170 python3 -m kernels.explore --kernel vision_rope_generation_bwd --out $OUT/explore_a.json --n 10 2>&1 | grep -v -i warn | tee $OUT/explore_a.log
timeout 120 python3 -m kernels.explore --kernel vision_rope3d_spatial_merge_bwd --out $OUT/explore_b.json --n 10 2>&1 | grep -v -i warn | tee $OUT/explore_b.log
timeout 230 python3 -m service.cli bench --default --n 30 --json $OUT/bench_default.json \
  --plot $OUT/bench_default.png --table $OUT/bench_default.txt 2>$OUT/bench_default.err
echo "bench rc=$?"; tail -3 $OUT/bench_default.err
