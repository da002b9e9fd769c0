"""Issue 34 on the H200: compiled kernels served with their configs. A real library (gemlite
0.6.0.post2's A16W4 linear layers, or Liger-Kernel 0.8.5: issue31_libs.py's ops), unchanged but
for the decorator swap, in fresh processes, each with its own fresh Triton cache
(TRITON_CACHE_DIR) unless said otherwise:

  triton        plain `triton.autotune`, cold
  ks-first      `@kernelsearch.autotune`, first host: tunes, shares the configs and uploads the
                winners' compile groups
  ks-served     second host: configs and compiled kernels served (expected: 0 benchmarks, 0
                compiles of the served kernels)
  ks-warm       the ks-served host again, its Triton cache kept: configs served, kernels local
  redis-first   `triton.autotune` with TRITON_CACHE_AUTOTUNING=1 and Triton's RemoteCacheManager
                over Redis (docs/benchmarks/triton_redis.py), an emptied Redis
  redis-second  the same on a fresh host: Triton's own shipping of compiled kernels
  ks-prefetch   a fresh host with KS_PREFETCH=1: every group of the device in one request, in
                the background from the first decorated kernel (the library's import)
  ks-otherfp    a fresh host whose compile fingerprint differs (KS_ARTIFACT_ENV stands for
                another driver): it must compile, not load, and still match triton.autotune

Each run records the time from the first call to all results, the configs benchmarked
(`Autotuner._bench` calls), the compiles and cache hits (`triton.knobs.compilation.listener`:
`cache_hit` False is a compile), the launcher .so files built with the C compiler and their
seconds (built on each host, as always: never shipped), the kernels compiled by name,
kernelsearch's sources, artifact counts (sets installed, launchers built at install, the
prefetch's own seconds) and service requests by route, and the whole process's seconds
(start-up included: a background prefetch's work is there); `table` sets them side by side
with every op's output against triton.autotune's.

    python3 issue34_artifacts.py all --lib gemlite --work DIR --service URL [--budget-s 300]
    python3 issue34_artifacts.py table DIR
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# In the order they run: the Redis hosts before the modes a short budget may skip.
MODES = ("triton", "ks-first", "ks-served", "ks-warm", "redis-first", "redis-second",
         "ks-prefetch", "ks-otherfp")
# Each mode's own time limit, whatever the budget has left (a first host tunes ~35 s on the
# H200, a process's start-up ~15 s); a mode starts while the budget has 15 s left.
COLD = ("triton", "ks-first", "redis-first")
COLD_TIMEOUT_S, WARM_TIMEOUT_S = 110.0, 60.0
OTHER_DRIVER = json.dumps({"driver": "simulated-other-driver 999.0"})


def run(lib: str, mode: str, work: Path) -> dict:
    import torch
    import triton
    from issue31_libs import _picks, _sources, gemlite_ops, liger_ops
    from triton import knobs
    from triton.runtime.autotuner import Autotuner

    benched: list[int] = []
    compiles: list[str] = []
    hits: list[str] = []
    real_bench = Autotuner._bench

    def counting(self, *a, **k):
        benched.append(1)
        return real_bench(self, *a, **k)

    def listener(*, src, metadata, metadata_group, times, cache_hit) -> None:
        (hits if cache_hit else compiles).append(getattr(src, "name", "?"))

    import triton.runtime.build as build

    real_build = build._build
    builds: list[float] = []

    def timed_build(*a, **k):  # a launcher (or Triton's cuda_utils) .so built with the C compiler
        t = time.perf_counter()
        try:
            return real_build(*a, **k)
        finally:
            builds.append(time.perf_counter() - t)

    requests: dict[str, int] = {}
    Autotuner._bench = counting
    knobs.compilation.listener = listener
    build._build = timed_build
    if mode.startswith("ks"):
        import logging

        import kernelsearch

        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        logging.getLogger("kernelsearch").setLevel(logging.INFO)
        triton.autotune = kernelsearch.autotune
        from kernelsearch.rest_client import Client

        real_request = Client._request

        def counted(self, method, path, **kw):  # the service round trips, by route
            requests[f"{method} {path}"] = requests.get(f"{method} {path}", 0) + 1
            return real_request(self, method, path, **kw)

        Client._request = counted
    got: dict = {"lib": lib, "mode": mode, "errors": {}}
    try:
        ops = liger_ops() if lib == "liger" else gemlite_ops()
    except Exception as exc:
        got["errors"]["setup"] = f"{type(exc).__name__}: {exc}"[:600]
        ops = {}
    torch.cuda.synchronize()
    # The inputs' set-up compiled nothing of the library's kernels; count from the first call.
    compiles.clear()
    hits.clear()
    builds.clear()
    outs: dict = {}
    t0 = time.perf_counter()
    for name, op in ops.items():
        try:
            outs[name] = [t.detach().float().cpu() for t in op()]
        except Exception as exc:
            got["errors"][name] = f"{type(exc).__name__}: {exc}"[:600]
    torch.cuda.synchronize()
    got["first_call_to_results_s"] = round(time.perf_counter() - t0, 2)
    got["configs_benchmarked"] = len(benched)
    got["compiles"] = len(compiles)
    got["cache_hits"] = len(hits)
    got["compiled"] = sorted(set(compiles))
    got["launcher_builds"] = len(builds)
    got["launcher_build_s"] = round(sum(builds), 2)
    got["sources"] = _sources()
    got["picks"] = _picks()
    got["ops"] = sorted(ops)
    if mode.startswith("ks"):
        from kernelsearch import artifacts
        from kernelsearch.kernels.compiled import environment
        from kernelsearch.backends import BACKENDS

        BACKENDS.drain(60)
        s = artifacts.STATS
        got["artifacts"] = {"installed": s.installed, "launchers": s.launchers, "uploaded": s.uploaded,
                            "rejected": s.rejected, "fetched_sets": s.fetched_sets,
                            "prefetch_s": round(s.prefetch_s, 2)}
        got["environment"] = environment()
        got["requests"] = requests
    work.mkdir(parents=True, exist_ok=True)
    torch.save(outs, work / f"{lib}-{mode}.pt")
    (work / f"{lib}-{mode}.json").write_text(json.dumps(got, indent=1, default=str))
    return got


def _redis_up() -> bool:
    try:
        import redis

        return bool(redis.Redis(socket_timeout=2).ping())
    except Exception:
        return False


def all_modes(lib: str, work: Path, service: str, budget_s: float, modes: list[str]) -> None:
    """Each mode in its own fresh process and Triton cache; a mode starts while `budget_s` has
    15 s left and runs to its own limit (the step may pass the budget by one mode's limit)."""
    end = time.monotonic() + budget_s
    here = Path(__file__).resolve().parent
    for mode in modes:
        left = end - time.monotonic()
        if left < 15:
            print(f"{mode}: skipped (no time left)")
            continue
        cache = work / f"tc_{lib}_{'ks-served' if mode == 'ks-warm' else mode}"
        if mode != "ks-warm":
            shutil.rmtree(cache, ignore_errors=True)
        env = dict(os.environ, TRITON_CACHE_DIR=str(cache), KS_SERVICE_URL=service,
                   KS_DATABASE_URL=f"sqlite:///{work}/absent.db", KS_AUTOTUNE_TIMEOUT_S="5")
        env.pop(("KS_ARTIFACT_ENV"), None)
        if mode == "ks-prefetch":
            env["KS_PREFETCH"] = "1"
        if mode == "ks-otherfp":
            env["KS_ARTIFACT_ENV"] = OTHER_DRIVER
        if mode.startswith("redis"):
            if not _redis_up():
                print(f"{mode}: skipped (no Redis on 127.0.0.1:6379)")
                continue
            if mode == "redis-first":
                import redis

                redis.Redis().flushall()
            env.update(TRITON_CACHE_AUTOTUNING="1",
                       TRITON_CACHE_MANAGER="triton.runtime.cache:RemoteCacheManager",
                       TRITON_REMOTE_CACHE_BACKEND="triton_redis:RedisBackend",
                       PYTHONPATH=f"{env.get('PYTHONPATH', '')}:{here}")
        err, t0 = work / f"{lib}-{mode}.err", time.monotonic()
        limit = COLD_TIMEOUT_S if mode in COLD else WARM_TIMEOUT_S
        try:
            with err.open("w") as fh:
                p = subprocess.run([sys.executable, __file__, "run", "--lib", lib, "--mode", mode,
                                    "--work", str(work)], env=env, stdout=subprocess.PIPE,
                                   stderr=fh, text=True, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            print(f"{mode}: timed out after its {limit:.0f} s")
            continue
        line = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
        out = work / f"{lib}-{mode}.json"
        if p.returncode == 0 and out.exists():  # the whole process too: work before the first call
            out.write_text(json.dumps({**json.loads(out.read_text()),
                                       "process_s": round(time.monotonic() - t0, 1)}, indent=1))
        print(line if p.returncode == 0 else f"{mode}: exit {p.returncode}; {err.read_text()[-600:]}")


def table(work: Path, out: Path | None) -> str:
    import torch
    from issue31_libs import LIBS, _compare

    lines, summary = [], {}
    for lib in LIBS:
        rows = {m: json.loads((work / f"{lib}-{m}.json").read_text())
                for m in MODES if (work / f"{lib}-{m}.json").exists()}
        if not rows:
            continue
        ref = (torch.load(work / f"{lib}-triton.pt", weights_only=True)
               if (work / f"{lib}-triton.pt").exists() else {})
        lines.append(f"== {lib}: ops {next(iter(rows.values()))['ops']}")
        lines.append(f"{'mode':13} {'first call->results':>20} {'benchmarked':>11} {'compiles':>8} "
                     f"{'hits':>5} {'.so builds':>13}  max rel err vs triton.autotune / kernelsearch")
        for m, r in rows.items():
            r["vs_triton"] = _compare(torch.load(work / f"{lib}-{m}.pt", weights_only=True), ref)
            errs = [v["rel_err"] for v in r["vs_triton"].values() if v is not None]
            missing = [k for k, v in r["vs_triton"].items() if v is None]
            lines.append(f"{m:13} {r['first_call_to_results_s']:>18.2f} s {r['configs_benchmarked']:>11} "
                         f"{r['compiles']:>8} {r['cache_hits']:>5} "
                         f"{r.get('launcher_builds', 0):>3} ({r.get('launcher_build_s', 0):5.2f} s)  "
                         f"{max(errs) if errs else float('nan'):.2e}"
                         f"{' missing ' + str(missing) if missing else ''}  "
                         f"{r.get('sources', {})} {r.get('artifacts', '')}")
            lines.append(f"{'':13} process {r.get('process_s', '?')} s; service requests "
                         f"{r.get('requests', {})}")
            if r["compiles"] and m in ("ks-served", "ks-warm", "ks-prefetch"):
                lines.append(f"{'':13} compiled: {r['compiled']}")
            for op, e in r["errors"].items():
                lines.append(f"{'':13} ERROR {op}: {e}")
        if "ks-served" in rows and "ks-warm" in rows:
            s, w = rows["ks-served"]["first_call_to_results_s"], rows["ks-warm"]["first_call_to_results_s"]
            lines.append(f"second host vs the same host warm: {s:.2f} s vs {w:.2f} s; within 10% or 1 s: "
                         f"{s <= max(w * 1.1, w + 1.0)}")
        if "ks-served" in rows and "redis-second" in rows:
            k, r = rows["ks-served"], rows["redis-second"]
            lines.append(f"kernelsearch second host vs Triton Redis second host: "
                         f"{k['first_call_to_results_s']:.2f} s vs {r['first_call_to_results_s']:.2f} s "
                         f"({k['compiles']} vs {r['compiles']} compiles, {k['configs_benchmarked']} vs "
                         f"{r['configs_benchmarked']} benchmarked); ahead: "
                         f"{k['first_call_to_results_s'] <= r['first_call_to_results_s']}")
        if "ks-prefetch" in rows and "ks-warm" in rows:
            p_, w = rows["ks-prefetch"]["first_call_to_results_s"], rows["ks-warm"]["first_call_to_results_s"]
            lines.append(f"prefetching host vs the same host warm: {p_:.2f} s vs {w:.2f} s; within 10% or 1 s: "
                         f"{p_ <= max(w * 1.1, w + 1.0)}")
        if "ks-otherfp" in rows:
            o = rows["ks-otherfp"]
            lines.append(f"another fingerprint compiled (not loaded): {o['compiles'] > 0 and not o['artifacts']['installed']}"
                         f" ({o['compiles']} compiles, {o['artifacts']['installed']} sets installed)")
        summary[lib] = rows
    text = "\n".join(lines)
    if out is not None:
        out.write_text(json.dumps(summary, indent=1, default=str))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--lib", required=True, choices=("liger", "gemlite"))
    r.add_argument("--mode", required=True, choices=MODES)
    r.add_argument("--work", type=Path, required=True)
    a_ = sub.add_parser("all")
    a_.add_argument("--lib", required=True, choices=("liger", "gemlite"))
    a_.add_argument("--work", type=Path, required=True)
    a_.add_argument("--service", required=True)
    a_.add_argument("--budget-s", type=float, default=300.0)
    a_.add_argument("--modes", default=",".join(MODES))
    t = sub.add_parser("table")
    t.add_argument("work", type=Path)
    t.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        got = run(a.lib, a.mode, a.work)
        print(json.dumps({k: got.get(k) for k in ("mode", "first_call_to_results_s",
                                                    "configs_benchmarked", "compiles", "cache_hits",
                                                    "launcher_builds", "launcher_build_s",
                                                    "sources", "artifacts", "errors")}))
    elif a.cmd == "all":
        all_modes(a.lib, a.work, a.service, a.budget_s, a.modes.split(","))
    else:
        print(table(a.work, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
