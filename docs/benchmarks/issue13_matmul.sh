#!/usr/bin/env bash
# Issue 13 on the H200: Triton's tutorial fp16 matmul (docs/examples/matmul, its 8 CUDA configs,
# key M, N, K) tuned through the service (API + a separate worker) at the 8 shapes 256^3 ... 8192^3
# and served to a second process; then a fresh process's time from its first call to all 8
# results with @triton.autotune, with @kernelsearch.autotune (warm service) and with the best
# configs fixed in advance, each on a cold (fresh TRITON_CACHE_DIR) and a warm Triton cache; then
# each pick's kernel latency side by side. Output: $OUT/issue13/{issue13_matmul.json,.txt}.
# Needs: torch 2.11, triton 3.6, no internet; SQLite by default (KS_DATABASE_URL to override).
# About 4-5 minutes.
set -u
OUT=${OUT:-/tmp/out}
D=$OUT/issue13
mkdir -p "$D" /tmp/ks13
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# The example as a user installs it (its entry point is how every process finds it); offline, so
# no build isolation. Where that cannot be done, the module on the path through KS_KERNEL_MODULES.
if python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site_ex docs/examples/matmul >/dev/null 2>&1; then
  export PYTHONPATH=/tmp/site_ex:${PYTHONPATH:-}
else
  echo "example not installable here: KS_KERNEL_MODULES instead of its entry point"
  export PYTHONPATH=$PWD/docs/examples/matmul:${PYTHONPATH:-} KS_KERNEL_MODULES=ks_matmul_example.declaration
fi
export PYTHONUNBUFFERED=1
export KS_DATABASE_URL=${KS_DATABASE_URL:-sqlite:////tmp/ks13/kernelsearch.db}
export KS_MEASURE_N=${KS_MEASURE_N:-30} KS_TRIAL_TIMEOUT_S=60 KS_WORKER_POLL_SECONDS=0.5 KS_TUNE_REFERENCE=eager
KS="python3 -m kernelsearch.service.cli"
PY="python3 docs/benchmarks/issue13_matmul.py"
PORT=8765
URL=http://127.0.0.1:$PORT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
$KS db upgrade || exit 1
export TRITON_CACHE_DIR=/tmp/ks13/triton_service   # the service's compiles stay out of the runs'
$KS serve --no-worker --port $PORT > "$D/api.log" 2>&1 &
API=$!
$KS worker > "$D/worker.log" 2>&1 &
WORKER=$!
trap 'kill $API $WORKER 2>/dev/null' EXIT
for _ in $(seq 60); do curl -sf $URL/healthz >/dev/null && break; sleep 1; done
curl -sf "$URL/v1/kernels/triton_tutorial_matmul" | head -c 300; echo

echo "== tune the 8 shapes through the service"
timeout 300 $PY tune --url $URL --out "$D/tune.json" --timeout 240 || tail -20 "$D/worker.log"

# The user's processes see the service only (no database of their own).
export KS_SERVICE_URL=$URL KS_DATABASE_URL=sqlite:////tmp/ks13/absent.db
echo "== a second process, served"
TRITON_CACHE_DIR=/tmp/ks13/tc_serve timeout 120 $PY serve-check --out "$D/serve_check.json" --fixed-out "$D/fixed.json"

echo "== fresh processes: first call to all 8 results"
for mode in ${KS13_MODES:-triton ks fixed}; do
  rm -rf /tmp/ks13/tc_$mode
  for cache in cold warm; do
    TRITON_CACHE_DIR=/tmp/ks13/tc_$mode timeout 120 $PY run --mode $mode --cache $cache \
      --out "$D/run_${mode}_$cache.json" --fixed "$D/fixed.json"
  done
done

echo "== each pick's kernel latency"
unset KS_SERVICE_URL
TRITON_CACHE_DIR=/tmp/ks13/tc_triton timeout 150 $PY latency --out "$D/latency.json" \
  --runs $(ls "$D"/run_triton_cold.json "$D"/run_triton_warm.json "$D"/run_ks_warm.json 2>/dev/null)
$PY report --dir "$D"
tail -3 "$D/worker.log"
