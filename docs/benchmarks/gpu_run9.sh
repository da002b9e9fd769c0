#!/usr/bin/env bash
# GPU call 9 (H200): the kernel and tuner test suites on the GPU with the final kernels (the
# `gpu`-marked tests run here instead of skipping; the others run on CUDA instead of the
# interpreter), and the protocol floors once more beside the shipped defaults.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels tests/search_space/test_space.py tests/search_space/test_tuner.py tests/search_space/test_runner_prefetch.py 2>&1 | tail -15
