"""The whole background-tuning loop on the GPU, through the product's own commands only: a
service (`kernelsearch serve --no-worker`), a worker (`kernelsearch worker`, its own process), and
a user's program that uses a real library unchanged but for the decorator swap
(`triton.autotune = kernelsearch.autotune` before the library is imported). The driver (`all`)
starts nothing but those commands and the user's programs, and prints one line per step:

  triton      plain triton.autotune, cold: the outputs every other program is compared with
  first       the user's program under KS_AUTOTUNE_FALLBACK=first and KS_AUTOTUNE_SEARCH_SPACE=derived:
              runs the first config after pruning, queues one capture job per key
  jobs        the worker tunes those jobs (0 failed expected)
  served      a fresh program (fresh Triton cache) under the default policy: every key from the
              service, 0 configs benchmarked, outputs within tolerance of triton.autotune's
  search      `kernelsearch search --from-captures`: one search job per key, the worker runs them
  searched    a fresh program: where a searched winner beats the list (its record's re-measured
              gain, the strict gate's evidence), it is served; no served winner below 1.0x
  (Helion's miss tuned by the worker and served is gpu.sh's `helion-queue` step.)

Libraries (KS39_LIBS): `flaggems` (FlagGems 5.0.2: layer norm, RMS norm's loop kernel, softmax
backward, MoE sum: `@libentry()` over `@triton.autotune`, keys over sizes) and `gemlite`
(0.6.0.post2, A16W4 at M=4096: its list's best leaves speed behind).

    python3 issue39_loop.py prog --lib flaggems --mode first --work DIR   # one user's program
    python3 issue39_loop.py all --service URL --work DIR --budget-s 420   # the whole loop
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any, Callable

LIBS = ("flaggems", "gemlite")
MODES = ("triton", "first", "served", "searched")


def flaggems_ops() -> dict[str, Callable[[], list]]:
    import torch
    from flag_gems.fused.moe_sum import moe_sum
    from flag_gems.ops.layernorm import layer_norm
    from flag_gems.ops.rms_norm import rms_norm
    from flag_gems.ops.softmax import softmax_backward

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(4096, 8192, device=dev, dtype=torch.float16, generator=g)
    w = torch.randn(8192, device=dev, dtype=torch.float16, generator=g)
    b = torch.randn(8192, device=dev, dtype=torch.float16, generator=g)
    big = torch.randn(1024, 65536, device=dev, dtype=torch.bfloat16, generator=g)
    wbig = torch.randn(65536, device=dev, dtype=torch.bfloat16, generator=g)
    sm_out = torch.softmax(torch.randn(2048, 4096, device=dev, generator=g), dim=-1)
    sm_grad = torch.randn(2048, 4096, device=dev, generator=g)
    experts = torch.randn(4096, 8, 4096, device=dev, dtype=torch.float16, generator=g)

    def ln() -> list:
        out = layer_norm(x, [8192], w, b, 1e-5)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def rms() -> list:
        out = rms_norm(big, [65536], wbig, 1e-5)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def smb() -> list:
        return [softmax_backward(sm_grad, sm_out, -1, torch.float32)]

    def moe() -> list:
        out = torch.empty(4096, 4096, device=dev, dtype=torch.float16)
        moe_sum(experts, out)
        return [out]

    return {"layer_norm": ln, "rms_norm_65536": rms, "softmax_backward": smb, "moe_sum": moe}


def gemlite_ops() -> dict[str, Callable[[], list]]:
    import torch
    from gemlite import core
    from gemlite.helper import A16W4_HQQ_INT

    dev, dt = "cuda", torch.float16
    g = torch.Generator(device=dev).manual_seed(0)
    n_in, n_out, group = 4096, 4096, 128
    w_q = torch.randint(0, 16, (n_out, n_in), device=dev, dtype=torch.uint8, generator=g)
    scales = torch.rand(n_out, n_in // group, device=dev, dtype=dt, generator=g) * 0.02 + 0.005
    zeros = torch.full((n_out, n_in // group), 7.5, device=dev, dtype=dt)
    layer = A16W4_HQQ_INT(device=dev, dtype=dt).from_weights(w_q, scales, zeros)
    x = torch.randn(4096, n_in, device=dev, dtype=dt, generator=g)

    def op() -> list:
        # gemlite's pruner answers from its own per-device config cache where it holds the shape:
        # emptied, the decorator's list is what it prunes (as on a host without that cache).
        getattr(core, "GEMLITE_TRITON_CONFIG_CACHE", {}).clear()
        with torch.no_grad():
            return [layer(x)]

    return {"a16w4_m4096": op}


def _config_dict(c: Any) -> dict:
    out = dict(c.kwargs)
    for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        v = getattr(c, name, None)
        if v is not None:
            out[name] = v
    return out


def _autotuners() -> list:
    from triton.runtime.autotuner import Autotuner

    return [o for o in gc.get_objects() if isinstance(o, Autotuner)]


def _error(exc: BaseException) -> str:
    where = [ln.strip() for ln in traceback.format_exception(exc) if ln.strip().startswith("File ")][-3:]
    return f"{type(exc).__name__}: {exc}"[:500] + " | at " + " <- ".join(reversed(where))


def prog(lib: str, mode: str, work: Path) -> dict:
    """One user's program: the library's ops once each, timed from the first call to all results."""
    import torch
    import triton
    from triton.runtime.autotuner import Autotuner

    benched: list[int] = []
    real_bench = Autotuner._bench

    def counting(self: Any, *a: Any, **k: Any) -> Any:
        benched.append(1)
        return real_bench(self, *a, **k)

    Autotuner._bench = counting  # type: ignore[method-assign]
    compiles: list[str] = []

    def listener(*, src: Any, cache_hit: bool, **_: Any) -> None:
        if not cache_hit:
            compiles.append(getattr(src, "name", "?"))

    triton.knobs.compilation.listener = listener
    if mode != "triton":
        import logging

        import kernelsearch

        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        logging.getLogger("kernelsearch").setLevel(logging.INFO)
        triton.autotune = kernelsearch.autotune
    got: dict = {"lib": lib, "mode": mode, "errors": {}}
    try:
        ops = flaggems_ops() if lib == "flaggems" else gemlite_ops()
    except Exception as exc:
        got["errors"]["setup"] = _error(exc)
        ops = {}
    torch.cuda.synchronize()
    compiles.clear()
    outs: dict = {}
    t0 = time.perf_counter()
    for name, op in ops.items():
        try:
            outs[name] = [t.detach().float().cpu() for t in op()]
        except Exception as exc:
            got["errors"][name] = _error(exc)
    torch.cuda.synchronize()
    got["first_call_to_results_s"] = round(time.perf_counter() - t0, 2)
    got["configs_benchmarked"] = len(benched)
    got["compiles"] = len(compiles)
    sources: dict = {}
    picks: dict = {}
    for at in _autotuners():
        fn = at.base_fn
        name = f"{fn.__module__}.{fn.__qualname__}"
        cache = at.cache if isinstance(at.cache, dict) else {}  # FlagGems' LibTuner keeps its own
        for key, cfg in cache.items():
            picks.setdefault(name, []).append([[str(v) for v in key], _config_dict(cfg)])
        for s in getattr(at, "sources", {}).values():
            sources[s.value] = sources.get(s.value, 0) + 1
    got["sources"], got["picks"] = sources, picks
    got["ops"] = sorted(ops)
    if mode != "triton":
        from kernelsearch.backends import BACKENDS

        BACKENDS.drain(60)
    # Per op, the op's latency (CUDA events, median of 20 after the first call), for the searched
    # program's comparison with the served one.
    lat: dict = {}
    for name, op in ops.items():
        if name in got["errors"]:
            continue
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            op()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        lat[name] = sorted(times)[len(times) // 2]
    got["op_ms"] = lat
    work.mkdir(parents=True, exist_ok=True)
    torch.save(outs, work / f"{lib}-{mode}.pt")
    (work / f"{lib}-{mode}.json").write_text(json.dumps(got, indent=1, default=str))
    return got


# -- the driver: the product's commands, one line per step ---------------------------------------
def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _run_prog(lib: str, mode: str, work: Path, env: dict, limit_s: float) -> dict | None:
    env = dict(os.environ, **env, TRITON_CACHE_DIR=str(work / f"tc_{lib}_{mode}"))
    if mode == "triton":
        env.pop("KS_SERVICE_URL", None)
    err = work / f"{lib}-{mode}.err"
    try:
        subprocess.run([sys.executable, __file__, "prog", "--lib", lib, "--mode", mode, "--work", str(work)],
                       env=env, stdout=subprocess.DEVNULL, stderr=err.open("w"), timeout=limit_s)
    except subprocess.TimeoutExpired:
        return None
    f = work / f"{lib}-{mode}.json"
    return json.loads(f.read_text()) if f.exists() else None


def _wait_jobs(service: str, since_id: int, deadline: float, *, kind: str | None = None,
               ids: set[int] | None = None) -> list[dict]:
    """The jobs queued after `since_id` (of `kind`), or those of `ids`, once all have ended."""
    while True:
        jobs = [j for j in _get(f"{service}/v1/jobs?limit=500")
                if (j["id"] in ids if ids is not None else j["id"] > since_id and kind in (None, j.get("kind")))]
        if all(j["status"] in ("succeeded", "failed", "cancelled") for j in jobs) or time.time() > deadline:
            return jobs
        time.sleep(3)


def _unfinished(jobs: list[dict]) -> list[str]:
    """Each job that did not succeed: its kernel's short name, its status and error."""
    return [f"{j['kernel'].rsplit('.', 1)[-1]}: {j['status']} {j.get('error') or ''}".strip()
            for j in jobs if j["status"] != "succeeded"]


def _max_job_id(service: str) -> int:
    return max([j["id"] for j in _get(f"{service}/v1/jobs?limit=500")] or [0])


def _compare(work: Path, lib: str, mode: str) -> float | None:
    import torch

    try:
        got = torch.load(work / f"{lib}-{mode}.pt", weights_only=True)
        ref = torch.load(work / f"{lib}-triton.pt", weights_only=True)
    except FileNotFoundError:
        return None
    errs = [float(torch.linalg.vector_norm(a.double() - b.double()) /
                  max(float(torch.linalg.vector_norm(b.double())), 1e-30))
            for name in ref for a, b in zip(got.get(name, []), ref[name])]
    return max(errs) if errs else None


def _line(step: str, ok: bool, text: str, summary: dict) -> None:
    summary.setdefault("steps", []).append({"step": step, "passed": ok, "text": text})
    print(f"{step:28} {'passed' if ok else 'FAILED'}  {text}", flush=True)


def loop(service: str, work: Path, budget_s: float, libs: list[str]) -> dict:
    end = time.time() + budget_s
    summary: dict = {"libs": libs}
    user_env = {"KS_SERVICE_URL": service, "KS_DATABASE_URL": f"sqlite:///{work}/absent.db",
                "KS_AUTOTUNE_TIMEOUT_S": "5"}
    for lib in libs:
        left = lambda: max(10.0, end - time.time())  # noqa: E731
        r = _run_prog(lib, "triton", work, user_env, min(240, left()))
        _line(f"{lib} triton.autotune", bool(r) and not r["errors"],
              f"{r['first_call_to_results_s']} s, {r['configs_benchmarked']} benchmarked, "
              f"{r['compiles']} compiles; errors {r['errors']}" if r else "no result", summary)
        before = _max_job_id(service)
        r = _run_prog(lib, "first", work, dict(user_env, KS_AUTOTUNE_FALLBACK="first",
                                               KS_AUTOTUNE_SEARCH_SPACE="derived"), min(240, left()))
        err = _compare(work, lib, "first")
        _line(f"{lib} first program", bool(r) and not r["errors"],
              f"{r['first_call_to_results_s']} s, sources {r['sources']}, {r['configs_benchmarked']} "
              f"benchmarked, vs triton.autotune {err}; errors {r['errors']}" if r else "no result", summary)
        jobs = _wait_jobs(service, before, time.time() + min(300, left()), kind="capture")
        failed = _unfinished(jobs)
        _line(f"{lib} worker tunes captures", bool(jobs) and not failed,
              f"{len(jobs)} jobs, {len(jobs) - len(failed)} succeeded; failed {failed}", summary)
        r = _run_prog(lib, "served", work, user_env, min(240, left()))
        err = _compare(work, lib, "served")
        ok = bool(r) and not r["errors"] and r["configs_benchmarked"] == 0 and set(r["sources"]) == {"service"}
        _line(f"{lib} fresh program served", ok,
              f"{r['first_call_to_results_s']} s, sources {r['sources']}, {r['configs_benchmarked']} "
              f"benchmarked, {r['compiles']} compiles, vs triton.autotune {err}; errors {r['errors']}"
              if r else "no result", summary)
        before = _max_job_id(service)
        # The library's own kernels only (the program's picks): the other library's keys were
        # searched in their own round. A key whose search the worker queued after its capture
        # job is answered "already queued", or searched again where that search has finished.
        first = json.loads((work / f"{lib}-first.json").read_text()) if (work / f"{lib}-first.json").exists() else {}
        outs, rcs, ids = [], [], set()
        for kernel in sorted(first.get("picks", {})):
            cli = subprocess.run([sys.executable, "-m", "kernelsearch.service.cli", "search", "--from-captures",
                                  "--kernel", kernel, "--json"], capture_output=True, text=True, timeout=120)
            rcs.append(cli.returncode)
            try:
                ids.update(row["id"] for row in json.loads(cli.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError, KeyError, TypeError):
                pass
            outs.append((cli.stdout.strip().splitlines() or [""])[-1][:160] + cli.stderr.strip()[-200:])
        _line(f"{lib} search --from-captures", bool(rcs) and not any(rcs), " | ".join(outs)[:600], summary)
        jobs = _wait_jobs(service, before, time.time() + min(420, left()), ids=ids)
        failed = _unfinished(jobs)
        _line(f"{lib} worker searches", bool(jobs) and not failed,
              f"{len(jobs)} jobs, {len(jobs) - len(failed)} succeeded; failed {failed}", summary)
        r = _run_prog(lib, "searched", work, user_env, min(240, left()))
        served = json.loads((work / f"{lib}-served.json").read_text()) if (work / f"{lib}-served.json").exists() else {}
        gains = {op: round(served.get("op_ms", {}).get(op, float("nan")) / ms, 3)
                 for op, ms in (r or {}).get("op_ms", {}).items()}
        recs = [x for x in _get(f"{service}/v1/records")
                if x.get("winner_origin") == "search"]
        err = _compare(work, lib, "searched")
        _line(f"{lib} searched winners served", bool(r) and not r["errors"] and r["configs_benchmarked"] == 0,
              f"sources {r['sources']}, vs triton.autotune {err}; op speed vs the list's served "
              f"program {gains}; searched records {[(x['kernel'].rsplit('.', 1)[-1], x.get('gain_vs_list')) for x in recs]}"
              if r else "no result", summary)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prog")
    p.add_argument("--lib", required=True, choices=LIBS)
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--work", type=Path, required=True)
    a_ = sub.add_parser("all")
    a_.add_argument("--service", required=True)
    a_.add_argument("--work", type=Path, required=True)
    a_.add_argument("--budget-s", type=float, default=420)
    a_.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.cmd == "prog":
        got = prog(a.lib, a.mode, a.work)
        print(json.dumps({k: got[k] for k in ("first_call_to_results_s", "configs_benchmarked", "sources")}))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    libs = os.environ.get("KS39_LIBS", "flaggems gemlite").split()
    summary = loop(a.service.rstrip("/"), a.work, a.budget_s, libs)
    if a.out:
        a.out.write_text(json.dumps(summary, indent=1, default=str))
    return 0 if all(s["passed"] for s in summary["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
