#!/usr/bin/env bash
# GPU call for issue 14 (H200): the kernel suite on the GPU (the domain's GPU test rejects
# `approx` on the largest angles), then A from 65,536 to 4,194,304 patches against the roofline,
# the candidates on the 16 suite cases, and the error table of run 16's shipped configs over the
# magnitude sweep and the angle range, on this checkout's code.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# kernelsearch itself: one import package mapped onto the repo's folders (pyproject's package-dir).
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 110 python3 -m pytest -q -p no:cacheprovider --tb=short -n 8 tests/kernels > $OUT/kernel_tests.log 2>&1
tail -3 $OUT/kernel_tests.log
timeout 460 python3 docs/benchmarks/issue14_a_large.py --out $OUT --suite \
  --records docs/benchmarks/run16/h200_records.json 2>&1 | tee $OUT/issue14_a_large.txt | grep -v -i warn | tail -80
