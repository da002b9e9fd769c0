"""Issue 25 on the H200: Helion's autotuning served by kernelsearch (`kernelsearch.helion`).

Two Helion kernels, a row softmax (fp16, 4096 x 4096) and an fp16 matmul (4096^3), autotuned with
`HELION_AUTOTUNE_EFFORT=quick`, each mode in a fresh process:

  tune    a first host: an empty Helion cache, the kernelsearch backend misses, Helion tunes and
          puts its entries to the service
  served  a second host: a fresh Helion cache directory (and fresh Triton/Inductor caches), the
          backend answers each key: Helion logs `remote cache hit` and does not tune; the
          compile groups the tuning host uploaded for each entry (issue 34) are installed before
          Helion compiles, so Triton's cache hits (`artifacts_installed`)
  served-other-build  the served host again, fresh caches, as if on another Triton build
          (`KS_ARTIFACT_ENV`): the entries are served, their compiled kernels are not loaded, Helion
          compiles them cold (served without compiled kernels) and the results still check
  local-configs   a third host given only the tuning host's Helion entries (its `*.best_config`
          files, as a container image could ship them) and no backend: Helion's own local cache
          on a fresh host, whose kernels compile cold as the served host's do
  served-compiled a fourth host with the tuning host's compiled kernels (Helion's Triton cache,
          Inductor's) but not its entries: the backend answers, nothing compiles cold; the
          served start-up less the compile, against `local`
  local   the first host again with Helion's own warm local cache and no backend
          (`HELION_AUTOTUNE_CACHE=LocalAutotuneCache`; its compiled kernels warm too)

With `--queue` the flow is the opt-in miss policy instead (`KS_HELION_ON_MISS=default`), on its
own fresh service:

  queue-miss    a fresh host misses: the backend queues a job per kernel and Helion runs its
                default config at once (no tuning in the user's process)
  (worker)      `kernelsearch worker` in its own process tunes both jobs from their captures and
                stores the entries (the time from the first job queued to the last one done)
  queue-served  another fresh host: remote hits with the worker's configs

Each mode reports the time from its first call to both results (and per kernel), Helion's cache
counters, the remote hits its log shows, and the configs it ran; the outputs are checked against
PyTorch. Without `--service-url` a service is started here (`kernelsearch serve --no-worker` on a
fresh SQLite database) and stopped at the end.

    python3 docs/benchmarks/issue25_helion.py OUT.json [--service-url URL] [--token TOKEN]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # importable without Helion or a GPU; the kernels exist only where Helion does
    import helion
    import helion.language as hl
    import torch
except ImportError:
    helion = None

MODES = ("tune", "served", "served-other-build", "local-configs", "served-compiled", "local")
QUEUE_MODES = ("queue-miss", "queue-served")
HOSTS = {"tune": "host1", "local": "host1", "served": "host2", "local-configs": "host3",
         "served-compiled": "host4", "queue-miss": "host5", "served-other-build": "host6",
         "queue-served": "host7"}
BACKEND = "kernelsearch.helion.KernelsearchBackend"
SOFTMAX_SHAPE = (4096, 4096)
MATMUL_SHAPE = (4096, 4096, 4096)

if helion is not None:
    @helion.kernel()
    def softmax(x: torch.Tensor) -> torch.Tensor:
        """Row softmax: one tile of rows at a time, the whole row in registers."""
        n, _m = x.size()
        out = torch.empty_like(x)
        for tile_n in hl.tile(n):
            out[tile_n, :] = torch.nn.functional.softmax(x[tile_n, :], dim=1)
        return out

    @helion.kernel()
    def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """fp16 matmul with an fp32 accumulator."""
        m, k = x.size()
        _k, n = y.size()
        out = torch.empty([m, n], dtype=x.dtype, device=x.device)
        for tile_m, tile_n in hl.tile([m, n]):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, x[tile_m, tile_k], y[tile_k, tile_n])
            out[tile_m, tile_n] = acc.to(x.dtype)
        return out


def child(mode: str) -> dict:
    """One mode in this (fresh) process: both kernels' first calls, timed to their results."""
    import logging
    from importlib.metadata import version

    if helion is None or not torch.cuda.is_available():
        raise SystemExit("issue25_helion: needs Helion 1.4.0 and a CUDA GPU")
    from helion._utils import counters

    # Helion logs a remote hit at DEBUG on this logger; the parent counts the lines.
    logging.basicConfig(stream=sys.stderr, format="%(name)s: %(message)s")
    logging.getLogger("helion.autotuner.remote_cache").setLevel(logging.DEBUG)
    torch.manual_seed(0)
    x = torch.randn(SOFTMAX_SHAPE, device="cuda", dtype=torch.float16)
    m, k, n = MATMUL_SHAPE
    a = torch.randn((m, k), device="cuda", dtype=torch.float16)
    b = torch.randn((k, n), device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    s = softmax(x)
    torch.cuda.synchronize()
    times["softmax_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    c = matmul(a, b)
    torch.cuda.synchronize()
    times["matmul_s"] = time.perf_counter() - t1
    times["first_result_s"] = time.perf_counter() - t0
    torch.testing.assert_close(s, torch.softmax(x.float(), dim=1).half(), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(c, (a.float() @ b.float()).half(), rtol=2e-2, atol=1e-1)
    configs = {}
    for name, kern, args in (("softmax", softmax, (x,)), ("matmul", matmul, (a, b))):
        cfg = kern.bind(args)._config
        configs[name] = json.loads(cfg.to_json()) if cfg is not None else None
    try:
        from kernelsearch import artifacts

        shared = {"artifacts_installed": artifacts.STATS.installed,
                  "artifacts_rejected": artifacts.STATS.rejected}
    except ImportError:
        shared = {}
    return {"mode": mode, **times, **shared, "counters": dict(counters["autotune"]), "configs": configs,
            "device": torch.cuda.get_device_name(), "helion": version("helion"),
            "torch": torch.__version__}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_service(work: Path) -> tuple[subprocess.Popen, str]:
    """`kernelsearch serve --no-worker` on a fresh SQLite database; its URL once it answers."""
    import httpx

    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KS_DATABASE_URL": f"sqlite:///{work / 'ks.db'}"}
    env.pop("KS_API_TOKEN", None)
    cli = [sys.executable, "-m", "kernelsearch.service.cli"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True)
    port = _free_port()
    proc = subprocess.Popen([*cli, "serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port)],
                            env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("issue25_helion: the service did not start")


def _prepare_host(mode: str, tuned: Path, home: Path) -> None:
    """host3: only the tuning host's entries; host4: its caches without the entries."""
    import shutil

    if mode == "local-configs":
        (home / "helion").mkdir(parents=True, exist_ok=True)
        for f in (tuned / "helion").glob("*.best_config"):
            shutil.copy2(f, home / "helion" / f.name)
    elif mode == "served-compiled":
        shutil.copytree(tuned, home, dirs_exist_ok=True)
        for f in (home / "helion").glob("*.best_config"):
            f.unlink()


def _run_mode(mode: str, work: Path, url: str, token: str | None) -> dict:
    """One mode in a fresh process with its own caches (served: fresh; local: the tune mode's)."""
    home = work / HOSTS[mode]
    _prepare_host(mode, work / "host1", home)
    env = {**os.environ, "HELION_CACHE_DIR": str(home / "helion"),
           "TRITON_CACHE_DIR": str(home / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
           "HELION_AUTOTUNE_EFFORT": "quick"}
    for var in ("HELION_FORCE_AUTOTUNE", "HELION_SKIP_CACHE", "HELION_REMOTE_CACHE_BACKEND"):
        env.pop(var, None)
    if mode.startswith("local"):
        env["HELION_AUTOTUNE_CACHE"] = "LocalAutotuneCache"
    else:
        env.update(HELION_AUTOTUNE_CACHE="RemoteAutotuneCache", HELION_REMOTE_CACHE_BACKEND=BACKEND,
                   KS_SERVICE_URL=url)
        if mode == "queue-miss":
            env["KS_HELION_ON_MISS"] = "default"
        if mode == "served-other-build":
            env["KS_ARTIFACT_ENV"] = json.dumps({"triton": "another-build"})
        if token:
            env["KS_API_TOKEN"] = token
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "--child", mode], env=env, capture_output=True,
                         text=True, timeout=3600)
    wall = time.perf_counter() - t0
    log = work / f"{mode}.stderr.txt"
    log.write_text(res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"issue25_helion: mode {mode} failed ({res.returncode}); see {log}\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["process_wall_s"] = wall
    out["remote_hits_logged"] = res.stderr.count("remote cache hit")
    out["stderr"] = str(log)
    return out


def _run_worker(work: Path, url: str, timeout_s: float = 900) -> dict:
    """`kernelsearch worker` (its own process, its own caches) until the queued Helion jobs end."""
    import httpx

    home = work / "host6"
    here = str(Path(__file__).resolve().parent)  # the jobs import this script as `issue25_helion`
    env = {**os.environ, "KS_DATABASE_URL": f"sqlite:///{work / 'ks.db'}",
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p),
           "HELION_CACHE_DIR": str(home / "helion"), "TRITON_CACHE_DIR": str(home / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor")}
    for var in ("HELION_AUTOTUNE_CACHE", "HELION_REMOTE_CACHE_BACKEND", "KS_HELION_ON_MISS"):
        env.pop(var, None)
    queued = httpx.get(f"{url}/v1/jobs", params={"limit": 20}, timeout=10).json()
    log = open(work / "worker.stderr.txt", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kernelsearch.service.cli", "worker"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    jobs: list = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            jobs = httpx.get(f"{url}/v1/jobs", params={"limit": 20}, timeout=10).json()
            if jobs and all(j["status"] in ("succeeded", "failed", "cancelled") for j in jobs):
                break
            time.sleep(2)
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    return {"jobs_queued": len(queued), "worker_s": time.perf_counter() - t0,
            "jobs": [{k: j.get(k) for k in ("id", "kernel", "status", "error")} for j in jobs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="where the JSON result goes")
    ap.add_argument("--service-url", help="a running kernelsearch service (default: start one here)")
    ap.add_argument("--token", default=os.environ.get("KS_API_TOKEN"), help="its writer token")
    ap.add_argument("--work", help="folder for the caches and logs (default: a fresh temporary one)")
    ap.add_argument("--queue", action="store_true",
                    help="the KS_HELION_ON_MISS=default flow (queue-miss, a worker, queue-served)")
    ap.add_argument("--child", choices=MODES + QUEUE_MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    if not args.out:
        ap.error("give the output path")
    work = Path(args.work or tempfile.mkdtemp(prefix="issue25_helion_"))
    work.mkdir(parents=True, exist_ok=True)
    proc = None
    url = args.service_url
    if url is None:
        proc, url = _start_service(work)
    try:
        if args.queue:
            modes = {"queue-miss": _run_mode("queue-miss", work, url, args.token)}
            modes["worker"] = _run_worker(work, url)
            modes["queue-served"] = _run_mode("queue-served", work, url, args.token)
        else:
            modes = {m: _run_mode(m, work, url, args.token) for m in MODES}
        import httpx

        entries = httpx.get(f"{url}/v1/helion/entries", params={"limit": 20}, timeout=10).json()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    result = {"service_url": url, "work": str(work), "modes": modes,
              "entries": [{k: e[k] for k in ("key", "kernel", "axes", "hardware", "config", "checked_by")}
                          for e in entries],
              "summary": {m: round(r["first_result_s"] if "first_result_s" in r else r["worker_s"], 3)
                          for m, r in modes.items()}}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
