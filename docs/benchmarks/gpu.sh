#!/usr/bin/env bash
# One script for every GPU call (H200, through the device tool): `bash docs/benchmarks/gpu.sh STEP...`
# runs the named steps in order, each writing under $OUT. docs/benchmarks/RUNS.md logs which steps
# each call ran and where its output is kept. Wheels in .whl/ (built here: the project, the
# measurement tools of docs/tools, the matmul example and the dependencies the GPU host lacks;
# RUNS.md has the lines) are installed first.
#   identity      source identities (Triton JIT keys) of the registered kernels, as this host computes them
#   kernel-tests  tests/kernels on the GPU (GPU-marked tests included)
#   issue14       A from 65,536 to 4,194,304 patches, the suite, the error table of $RECORDS' configs
#   floors        what the protocol lets any kernel reach: A and B against a pure read / a copy of their bytes,
#                 under the benchmark's write flush and a read flush (docs/benchmarks/issue14_floors.py)
#   tune          all 32 suite cases tuned into a fresh database, then exported ($OUT/h200_records.json)
#   retune        $RECORDS imported, then $RETUNE_KERNEL's suite cases tuned $TRIALS more trials each through
#                 `kernelsearch tune` (a faster correct config replaces a record), exported ($OUT/h200_records.json)
#   bench         kernelsearch bench with the database's records (eager, compile, default, tuned)
#   bench-before  the same with the package as it was before issue 26's refactor (.whl_old/, commit 537c288)
#   issue13       the matmul example through the service, and triton.autotune vs kernelsearch.autotune
#   issue22       fla-core (flash-linear-attention, .whl/) unchanged but for the decorator swap: triton.autotune
#                 on a cold host, kernelsearch on a first host (tunes, shares) and a second (served), and
#                 the configs fixed in advance; fresh processes and Triton caches (docs/benchmarks/issue22_fla.py)
#   compile       torch.compile of an @kernelsearch.autotune softmax: tuned eagerly on one host and shared,
#                 then compiled on a fresh one (served at trace time), against plain triton.autotune compiled
#                 (docs/benchmarks/issue25_compile.py)
#   tcache        fla unchanged with TRITON_CACHE_AUTOTUNING=1: Triton's Redis remote cache on a first (cold)
#                 and a second host (its RedisRemoteCacheBackend given the attribute 3.6.0 lacks:
#                 docs/benchmarks/triton_redis.py), kernelsearch.triton_cache on a first and a second host (issue22_fla.py's
#                 tc-* modes; TCACHE_MODES=tc-triton adds Triton's file cache alone)
#   issue31       two real libraries other than fla-core (.whl/: liger-kernel 0.8.5, gemlite 0.6.0.post2) unchanged
#                 but for the decorator swap: triton.autotune on a cold host, kernelsearch on a first host (tunes,
#                 shares) and a second (served); outputs against triton.autotune's (docs/benchmarks/issue31_libs.py)
#   issue34       compiled kernels served with their configs: gemlite (.whl/, as issue31) unchanged but for the
#                 swap, triton.autotune cold, a first host (tunes, uploads configs and compile groups), a
#                 second host served (0 benchmarks, 0 compiles expected), the same host warm, a prefetching
#                 host, a host of another compile fingerprint (compiles, still correct), Triton's Redis
#                 manager's first and second host; fresh processes and Triton caches
#                 (docs/benchmarks/issue34_artifacts.py; ISSUE34_LIBS=liger adds Liger-Kernel)
#   helion        Helion (.whl/) through kernelsearch.helion: a softmax and an fp16 matmul tuned on a first host,
#                 served on a second, against Helion's own local cache given the entries alone and warm
#                 (docs/benchmarks/issue25_helion.py)
#   helion-queue  the same kernels under KS_HELION_ON_MISS=default: a fresh host runs Helion's default
#                 configs and queues jobs, `kernelsearch worker` tunes them, a later host is served
#   issue35       search beyond the list: gemlite, Liger-Kernel and fla's @triton.autotune kernels, a per-key
#                 Optuna search of the derived space within a time share (ISSUE35_TOTAL_S; KS35_TRIALS, KS35_KEY_S,
#                 KS35_REPEATS), every candidate through the library's own pruner, the strict gate, the interleaved
#                 re-measure and a sweep of the same space (exhaustive where it fits) (docs/benchmarks/issue35_search.py)
#   loop          the background-tuning loop through the product's commands only: `kernelsearch serve`,
#                 `kernelsearch worker`, a user's program with FlagGems and gemlite (.whl/) unchanged but
#                 for the swap under `first` (queues capture jobs), the worker's jobs, a fresh program
#                 served, `kernelsearch search --from-captures`, the worker's searches, a fresh program
#                 served the searched winners; one line per step (docs/benchmarks/issue39_loop.py); then
#                 a cubin of another kernel offered as a record's, refused by the service and a host
#                 (docs/benchmarks/issue43_trust.py)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/ks
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# The tools (kernelsearch_tools: the tune step's efficiency experiment) from source where .whl/ lacks them.
if ! ls .whl/kernelsearch_tools-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site docs/tools || exit 1
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export KS_DATABASE_URL=${KS_DATABASE_URL:-sqlite:////tmp/ks/kernelsearch.db}
KS="python3 -m kernelsearch.service.cli"
RECORDS=${RECORDS:-service/data/h200_records.json}
# Redis for the baselines (Triton's and Inductor's remote caches): the host's, else the Debian build
# carried in .redis/ (the binary and its libraries).
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && [ -x .redis/redis-server ]; then
  LD_LIBRARY_PATH=$PWD/.redis .redis/redis-server --port 6379 --save '' --daemonize yes >/dev/null 2>&1 \
    && echo "redis started from .redis/" || echo "redis did not start"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for step in "$@"; do
  echo "== $step $(date +%T)"
  case $step in
    identity)
      python3 -c "from kernelsearch import kernels
for n in kernels.kernel_names(): print(n, kernels.get_kernel(n).source_hash)" | tee $OUT/identity.txt ;;
    kernel-tests)
      timeout ${TESTS_S:-110} python3 -m pytest -q -p no:cacheprovider --tb=short -n 8 tests/kernels tests/plugins \
        > $OUT/kernel_tests.log 2>&1; tail -4 $OUT/kernel_tests.log ;;
    issue14)
      ER=${ISSUE14_RECORDS-$RECORDS}  # set ISSUE14_RECORDS= (empty) to skip the error table
      timeout ${ISSUE14_S:-400} python3 docs/benchmarks/issue14_a_large.py --out $OUT ${ER:+--records $ER} \
        ${ISSUE14_ARGS:---suite} 2>&1 | grep -v -i warn | tee $OUT/issue14.txt | tail -${TAIL:-60} ;;
    floors)
      timeout ${FLOORS_S:-300} python3 docs/benchmarks/issue14_floors.py --out $OUT --records $RECORDS 2>&1 \
        | grep -v -i warn | tee $OUT/floors.txt | tail -${TAIL:-60} ;;
    tune)
      $KS db upgrade >/dev/null
      timeout ${TUNE_S:-330} python3 -m kernelsearch_tools.efficiency --out $OUT/tune --mode throughput \
        --throughput-trials ${TRIALS:-32} --budget-s ${BUDGET_S:-300} --measure-n 30 --trial-timeout 30 \
        --db $KS_DATABASE_URL 2>&1 | grep -v -i warn | tail -25
      $KS records export $OUT/h200_records.json ;;
    retune)
      $KS db upgrade >/dev/null
      $KS records import $RECORDS
      timeout ${RETUNE_S:-200} $KS tune ${RETUNE_KERNEL:-vision_rope_generation_bwd} --all --trials ${TRIALS:-32} \
        --json $OUT/retune.json 2>&1 | grep -v -i warn | tail -25
      $KS records export $OUT/h200_records.json ;;
    bench)
      $KS db upgrade >/dev/null
      $KS records import --if-empty $RECORDS
      timeout ${BENCH_S:-170} $KS bench --compare-default --n 30 --json $OUT/bench.json \
        --table $OUT/bench.txt 2>$OUT/bench.err; echo "bench rc=$?"; grep -i mean $OUT/bench.txt ;;
    bench-before)
      # The bench step on the package before issue 26's refactor (.whl_old/: commit 537c288's wheel,
      # the same dependencies), its own database with the same records: before/after in one call.
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_old .whl_old/kernelsearch-*.whl || exit 1
      (export PYTHONPATH=/tmp/site_old:/tmp/site KS_DATABASE_URL=sqlite:////tmp/ks/before.db
       $KS db upgrade >/dev/null && $KS records import --if-empty $RECORDS
       timeout ${BENCH_S:-170} $KS bench --compare-default --n 30 --json $OUT/bench_before.json \
         --table $OUT/bench_before.txt 2>$OUT/bench_before.err; echo "bench-before rc=$?"
       grep -i mean $OUT/bench_before.txt) ;;
    issue13)
      timeout ${ISSUE13_S:-420} bash docs/benchmarks/issue13_matmul.sh 2>&1 | grep -v -i warn | tail -40 ;;
    issue22)
      D=$OUT/issue22; mkdir -p $D /tmp/ks22
      export KS_DATABASE_URL=sqlite:////tmp/ks22/kernelsearch.db
      $KS db upgrade >/dev/null
      $KS serve --no-worker --port 8722 > $D/api.log 2>&1 &
      API=$!
      for _ in $(seq 60); do curl -sf http://127.0.0.1:8722/healthz >/dev/null && break; sleep 1; done
      for mode in ${ISSUE22_MODES:-triton ks-first ks-served fixed}; do
        rm -rf /tmp/ks22/tc_$mode
        TRITON_CACHE_DIR=/tmp/ks22/tc_$mode KS_SERVICE_URL=http://127.0.0.1:8722 \
          KS_DATABASE_URL=sqlite:////tmp/ks22/absent.db timeout ${ISSUE22_S:-240} \
          python3 docs/benchmarks/issue22_fla.py run --mode $mode --out $D --fixed $D/ks-first.json \
          2>$D/$mode.err | tail -1
      done
      python3 docs/benchmarks/issue22_fla.py table $D | tee $D/table.txt
      $KS records list 2>/dev/null | grep -c fla. | sed 's/^/fla records in the store: /'
      $KS records export $D/records.json >/dev/null; kill $API ;;
    compile)
      D=$OUT/compile; mkdir -p $D /tmp/ks25c
      export KS_DATABASE_URL=sqlite:////tmp/ks25c/kernelsearch.db
      $KS db upgrade >/dev/null
      $KS serve --no-worker --port 8725 > $D/api.log 2>&1 &
      API=$!
      for _ in $(seq 60); do curl -sf http://127.0.0.1:8725/healthz >/dev/null && break; sleep 1; done
      for mode in share compiled baseline baseline-second; do
        TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=1 TORCHINDUCTOR_REDIS_URL=redis://127.0.0.1:6379 \
        TRITON_CACHE_DIR=/tmp/ks25c/tc_$mode TORCHINDUCTOR_CACHE_DIR=/tmp/ks25c/ind_$mode \
          KS_SERVICE_URL=http://127.0.0.1:8725 KS_DATABASE_URL=sqlite:////tmp/ks25c/absent.db \
          KS_AUTOTUNE_TIMEOUT_S=5 timeout ${COMPILE_S:-150} python3 docs/benchmarks/issue25_compile.py $mode \
          2>$D/$mode.err | tail -1 | tee -a $D/compile.jsonl
        grep -h 'kernelsearch\|torch.compile runs' $D/$mode.err | grep -v -i warn | tail -3
      done
      kill $API ;;
    tcache)
      D=$OUT/tcache; mkdir -p $D /tmp/ks25t
      export KS_DATABASE_URL=sqlite:////tmp/ks25t/kernelsearch.db
      $KS db upgrade >/dev/null
      $KS serve --no-worker --port 8726 > $D/api.log 2>&1 &
      API=$!
      for _ in $(seq 60); do curl -sf http://127.0.0.1:8726/healthz >/dev/null && break; sleep 1; done
      for mode in ${TCACHE_MODES:-tc-redis-first tc-redis-second tc-ks-first tc-ks-second}; do
        case $mode in
          tc-ks-*) MGR=kernelsearch.triton_cache:AutotuneCacheManager ;;
          tc-redis-*) MGR=triton.runtime.cache:RemoteCacheManager ;;
          *) MGR= ;;
        esac
        rm -rf /tmp/ks25t/tc_$mode
        # The Redis baseline starts from an empty Redis; Triton 3.6.0's backend needs triton_redis.py.
        [ $mode = tc-redis-first ] && python3 -c "import redis; redis.Redis().flushall()"
        env TRITON_CACHE_AUTOTUNING=1 ${MGR:+TRITON_CACHE_MANAGER=$MGR} \
          TRITON_REMOTE_CACHE_BACKEND=triton_redis:RedisBackend PYTHONPATH=$PYTHONPATH:$PWD/docs/benchmarks \
          TRITON_CACHE_DIR=/tmp/ks25t/tc_$mode KS_SERVICE_URL=http://127.0.0.1:8726 \
          KS_DATABASE_URL=sqlite:////tmp/ks25t/absent.db KS_AUTOTUNE_TIMEOUT_S=5 timeout ${TCACHE_S:-200} \
          python3 docs/benchmarks/issue22_fla.py run --mode $mode --out $D 2>$D/$mode.err | tail -1
        [ -s $D/$mode.json ] || { echo "$mode failed:"; grep -v -i warn $D/$mode.err | tail -4; }
      done
      python3 docs/benchmarks/issue22_fla.py table $D | tee $D/table.txt
      $KS records export $D/records.json >/dev/null; kill $API ;;
    issue31)
      D=$OUT/issue31; W=/tmp/ks31; mkdir -p $D $W
      export KS_DATABASE_URL=sqlite:///$W/kernelsearch.db
      $KS db upgrade >/dev/null
      $KS serve --no-worker --port 8731 > $D/api.log 2>&1 &
      API=$!
      for _ in $(seq 60); do curl -sf http://127.0.0.1:8731/healthz >/dev/null && break; sleep 1; done
      curl -sf http://127.0.0.1:8731/healthz >/dev/null || { echo "the service did not start:"; tail -3 $D/api.log; }
      END=$((SECONDS + ${ISSUE31_TOTAL_S:-540}))  # every mode ends in time for the table
      for lib in ${ISSUE31_LIBS:-liger gemlite}; do
        for mode in triton ks-first ks-served; do
          LEFT=$((END - SECONDS)); LIMIT=$(( LEFT < ${ISSUE31_S:-150} ? LEFT : ${ISSUE31_S:-150} ))
          [ $LIMIT -gt 10 ] || { echo "$lib $mode: skipped (no time left)"; continue; }
          rm -rf $W/tc_${lib}_$mode
          TRITON_CACHE_DIR=$W/tc_${lib}_$mode KS_SERVICE_URL=http://127.0.0.1:8731 \
            KS_DATABASE_URL=sqlite:///$W/absent.db timeout $LIMIT \
            python3 docs/benchmarks/issue31_libs.py run --lib $lib --mode $mode --work $W \
            2>$W/$lib-$mode.err | tail -1
          { echo "== $lib $mode"; grep -v -i warn $W/$lib-$mode.err | tail -${TAIL:-25}; } >> $D/stderr_tails.txt
        done
      done
      python3 docs/benchmarks/issue31_libs.py table $W --out $D/summary.json | tee $D/table.txt
      $KS records list 2>/dev/null | grep -c -E "liger|gemlite" | sed 's/^/liger and gemlite records in the store: /'
      $KS records export $D/records.json >/dev/null; kill $API ;;
    issue34)
      # $OUT/issue34 keeps 3 files (the device returns few): table.txt, summary.json and logs.tar.gz
      # (each mode's stderr, the service's log, the records).
      D=$OUT/issue34; W=/tmp/ks34; rm -rf $W $D; mkdir -p $D $W
      export KS_DATABASE_URL=sqlite:///$W/kernelsearch.db
      $KS db upgrade >/dev/null
      $KS serve --no-worker --port 8734 > $W/api.log 2>&1 &
      API=$!
      for _ in $(seq 60); do curl -sf http://127.0.0.1:8734/healthz >/dev/null && break; sleep 1; done
      curl -sf http://127.0.0.1:8734/healthz >/dev/null || { echo "the service did not start:"; tail -3 $W/api.log; }
      (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && echo "redis: up on 6379" || echo "redis: not up (the redis modes skip)"
      for lib in ${ISSUE34_LIBS:-gemlite}; do
        python3 docs/benchmarks/issue34_artifacts.py all --lib $lib --work $W \
          --service http://127.0.0.1:8734 --budget-s ${ISSUE34_S:-300}
      done
      python3 docs/benchmarks/issue34_artifacts.py table $W --out $D/summary.json | tee $D/table.txt
      $KS records export $W/records.json >/dev/null; kill $API
      (cd $W && tar czf $D/logs.tar.gz *.err api.log records.json 2>/dev/null) ;;
    helion)
      # .whl/ must add helion 1.4.0 and the dependencies the host lacks (filecheck, scikit-learn, ...).
      D=$OUT/issue25; mkdir -p $D
      timeout ${ISSUE25_S:-540} python3 docs/benchmarks/issue25_helion.py $D/issue25_helion.json \
        --work /tmp/ks25 2>&1 | tail -5
      cp /tmp/ks25/*.stderr.txt $D/ 2>/dev/null ;;
    helion-queue)
      D=$OUT/issue25q; mkdir -p $D
      timeout ${ISSUE25Q_S:-400} python3 docs/benchmarks/issue25_helion.py $D/issue25_helion_queue.json \
        --queue --work /tmp/ks25q 2>&1 | tail -5
      cp /tmp/ks25q/*.stderr.txt $D/ 2>/dev/null ;;
    issue35)
      # Search beyond the list (issue 35): per key of gemlite, Liger-Kernel and fla, a budgeted
      # Optuna search of the derived space, the strict gate, the interleaved re-measure and a sweep
      # of the same space; ISSUE35_TOTAL_S (~6 min) shared equally among the libraries left, each
      # library's share among its keys. Leaves 3 files: table.txt, summary.json and issue35.tar.gz
      # (each library's JSON, stderr and Optuna studies).
      D=$OUT/issue35; W=/tmp/ks35; rm -rf $W; mkdir -p $D $W/res
      END=$((SECONDS + ${ISSUE35_TOTAL_S:-360}))
      L35=(${ISSUE35_LIBS:-gemlite liger fla})
      for i in "${!L35[@]}"; do
        lib=${L35[$i]}; LIMIT=$(( (END - SECONDS - 15) / (${#L35[@]} - i) ))
        [ $LIMIT -gt 30 ] || { echo "$lib: skipped (no time left)"; continue; }
        TRITON_CACHE_DIR=$W/tc_$lib timeout $((LIMIT + 10)) python3 docs/benchmarks/issue35_search.py \
          run --lib $lib --out $W/res --deadline-s $((LIMIT - 15)) 2>$W/res/$lib.err | tail -1
        [ -s $W/res/$lib.json ] || { echo "$lib: no result"; grep -v -i warn $W/res/$lib.err | tail -4; }
      done
      python3 docs/benchmarks/issue35_search.py table $W/res --summary $D/summary.json | tee $D/table.txt
      tar -czf $D/issue35.tar.gz -C $W res ;;
    loop)
      # $OUT/loop keeps: steps.txt (one line per step), summary.json, logs.tar.gz (every program's
      # stderr, the service's and the worker's logs, the records).
      D=$OUT/loop; W=/tmp/ks39; rm -rf $W $D; mkdir -p $D $W
      export KS_DATABASE_URL=sqlite:///$W/kernelsearch.db KS_JOB_MODULES=${KS_JOB_MODULES:-flag_gems,gemlite}
      export KS_SEARCH_TRIALS=${KS_SEARCH_TRIALS:-16} KS_SEARCH_S=${KS_SEARCH_S:-60}
      $KS db upgrade >/dev/null
      $KS serve --no-worker --port 8739 > $W/api.log 2>&1 &
      API=$!
      $KS worker > $W/worker.log 2>&1 &
      WORKER=$!
      for _ in $(seq 60); do curl -sf http://127.0.0.1:8739/healthz >/dev/null && break; sleep 1; done
      curl -sf http://127.0.0.1:8739/healthz >/dev/null || { echo "the service did not start:"; tail -3 $W/api.log; }
      KS_SERVICE_URL=http://127.0.0.1:8739 timeout ${LOOP_S:-480} python3 docs/benchmarks/issue39_loop.py all \
        --service http://127.0.0.1:8739 --work $W --budget-s $(( ${LOOP_S:-480} - 20 )) --out $D/summary.json \
        | tee $D/steps.txt
      # Issue 43 on real compile groups: a cubin of another kernel refused by the service and the host.
      KS_SERVICE_URL=http://127.0.0.1:8739 TRITON_CACHE_DIR=$W/tc_trust timeout 120 python3 \
        docs/benchmarks/issue43_trust.py --service http://127.0.0.1:8739 2>$W/trust.err | tee $D/trust.txt
      kill $WORKER; sleep 2; kill $API
      $KS records export $W/records.json >/dev/null 2>&1
      (cd $W && tar czf $D/logs.tar.gz *.err *.json api.log worker.log 2>/dev/null) ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
