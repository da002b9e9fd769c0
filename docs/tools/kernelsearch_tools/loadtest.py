"""Bounded load test of best-config lookups (GET /v1/best) against one `kernelsearch serve`.

Loopback only, a fixed number of requests and a hard time limit. With --spawn it creates a
private SQLite database, seeds it with records (every suite case of every kernel on one device,
each with its own config, or the records of --seed-file), starts `kernelsearch serve --no-worker`
on a free loopback port, checks every lookup's answer before and after the load, and stops the
server again. The load comes from `wrk` (a C load generator; Debian package `wrk`) driven by a
Lua script that stops after the asked request count, or from Python processes (--engine python)
where wrk is missing; a Python client on a 2-core machine saturates itself before the server.

    python -m kernelsearch_tools.loadtest --spawn --requests 40000 --clients 16 --json var/load.json

Prints p50/p90/p99 latency and requests per second and writes the same as JSON.
"""
from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

DEFAULT_DEVICE = "NVIDIA H200"


class LoadTestError(RuntimeError):
    """The load test could not run, or an answer was wrong."""


# ----------------------------------------------------------------------------- the workload
@dataclass(frozen=True)
class Lookup:
    """One GET /v1/best and the answer it must get."""

    path: str
    kernel: str
    axes: dict[str, int]
    match: str
    config: dict[str, Any]


def require_loopback(url: str) -> str:
    """The URL itself when its host is a loopback address; the load never leaves this machine."""
    host = urlsplit(url).hostname or ""
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        raise LoadTestError(f"--url must point at 127.0.0.1 / ::1 / localhost, got {url!r}")
    return url.rstrip("/")


def synthetic_configs(kernel: Any, n: int) -> list[dict[str, Any]]:
    """n distinct valid configs of the kernel (so a wrong answer cannot look right by chance)."""
    from kernelsearch.kernels.errors import InvalidConfig
    from kernelsearch.kernels.spec import config_key

    names = [p.name for p in kernel.params]
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for values in itertools.product(*(p.choices for p in kernel.params)):
        try:
            cfg = kernel.validate_config(dict(zip(names, values)))
        except InvalidConfig:
            continue
        key = config_key(cfg)
        if key not in seen:
            seen.add(key)
            out.append(cfg)
        if len(out) == n:
            break
    if not out:
        raise LoadTestError(f"{kernel.name}: no valid config found to seed with")
    return [out[i % len(out)] for i in range(n)]


def seed_synthetic(url: str, device: str) -> int:
    """Store one record per suite case of every installed kernel (entry points: what the server
    it starts knows too) on `device`; returns the count."""
    from importlib.metadata import entry_points

    from kernelsearch import kernels
    from kernelsearch.db.store import Store
    from kernelsearch.search_space.acceptance import accepted
    from kernelsearch.search_space.records import measured_record

    store = Store(url)
    n = 0
    try:
        installed = sorted({ep.name for ep in entry_points(group=kernels.registry.ENTRY_POINT_GROUP)})
        for kernel in (kernels.get_kernel(name) for name in installed):
            configs = synthetic_configs(kernel, len(kernel.cases))
            for i, case in enumerate(kernel.cases):
                lat = 5.0 + i
                store.upsert_best(accepted(measured_record(
                    kernel, case.axes, device, torch_version="2.11.0", triton_version="3.6.0",
                    config=configs[i], latency_median_us=lat,
                    latency_min_us=lat * 0.95, latency_max_us=lat * 1.1, latency_iqr_us=lat * 0.02,
                    timing_method="cupti", rel_error=1e-7, n_trials=50, n_failed=3,
                    roofline_pct=50.0, speedup_eager=20.0, speedup_compile=5.0)))
                n += 1
    finally:
        store.close()
    return n


def seed_file(url: str, path: Path) -> int:
    """Import a `kernelsearch records export` file; returns the records it holds."""
    from kernelsearch.db.store import Store
    from kernelsearch.search_space.acceptance import import_check

    doc = json.loads(path.read_text())
    store = Store(url)
    try:
        store.import_records(doc, check=import_check)
    finally:
        store.close()
    return len(doc.get("records", []))


def build_lookups(url: str, device: str) -> list[Lookup]:
    """An exact lookup for every current record on `device`, and a nearest one per kernel case
    shifted by one (no record there), with the answer the store itself gives for each."""
    from kernelsearch import kernels
    from kernelsearch.db.store import Store

    store = Store(url)
    try:
        records = store.list_records(device=device)
        if not records:
            raise LoadTestError(f"no records on device {device!r} to look up")
        out: list[Lookup] = []
        for r in records:
            kernel = kernels.get_kernel(r.kernel)
            shifted = {a: v + 1 if isinstance(v, int) else v for a, v in r.axes.items()}
            for axes in (dict(r.axes), shifted):
                try:
                    axes = kernel.validate_axes(axes)
                except ValueError:
                    continue
                found = store.find_best(r.kernel, device, axes,
                                        distance=lambda other, _w, k=kernel, a=axes: k.distance(a, other))
                if found is None:
                    raise LoadTestError(f"store finds no record for {r.kernel} {axes}")
                rec, match = found
                query = {"kernel": r.kernel, "device": device, **axes}
                out.append(Lookup("/v1/best?" + urlencode(query), r.kernel, axes, match, rec.config))
        # The shifted cases can collide with a real one: keep each path once.
        return list({lk.path: lk for lk in out}.values())
    finally:
        store.close()


def verify(base: str, lookups: list[Lookup], token: str | None = None) -> int:
    """Ask every lookup once; raise LoadTestError on the first wrong answer. Returns the count."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=base, timeout=10, headers=headers) as c:
        for lk in lookups:
            r = c.get(lk.path)
            if r.status_code != 200:
                raise LoadTestError(f"{lk.path}: HTTP {r.status_code}: {r.text[:300]}")
            body = r.json()
            if body.get("match") != lk.match or body.get("config") != lk.config:
                raise LoadTestError(f"{lk.path}: expected match={lk.match} config={lk.config}, "
                                    f"got match={body.get('match')} config={body.get('config')}")
    return len(lookups)


# ----------------------------------------------------------------------------- the server
@dataclass
class Server:
    """A `kernelsearch serve --no-worker` child on a loopback port."""

    proc: subprocess.Popen
    base: str
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kernelsearch_exe() -> str:
    """The console script of the running interpreter's environment, else the one on PATH."""
    here = Path(sys.executable).parent / "kernelsearch"
    exe = str(here) if here.exists() else shutil.which("kernelsearch")
    if not exe:
        raise LoadTestError("the `kernelsearch` command is not installed (pip install -e .)")
    return exe


def start_server(db_url: str, workdir: Path, *, extra_env: dict[str, str] | None = None,
                 wait_s: float = 90.0) -> Server:
    """Start the API on a free loopback port and wait until /healthz answers 200."""
    port = free_port()
    env = {**os.environ, "KS_DATABASE_URL": db_url, "KS_LOG_LEVEL": "WARNING", **(extra_env or {})}
    log = workdir / "serve.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([kernelsearch_exe(), "serve", "--host", "127.0.0.1", "--port",
                                 str(port), "--no-worker"], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, cwd=workdir)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LoadTestError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(server.base + "/healthz", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise LoadTestError(f"server not healthy within {wait_s:.0f} s: {log.read_text()[-2000:]}")


# ----------------------------------------------------------------------------- load engines
@dataclass
class Result:
    engine: str
    requests: int
    errors: int
    non_2xx: int
    duration_s: float
    req_per_s: float
    latency_ms: dict[str, float]
    clients: int
    extra: dict[str, Any] = field(default_factory=dict)


WRK_LUA = r"""
-- Generated by kernelsearch_tools/loadtest.py: round-robin over the paths, each thread stops after its
-- share of the fixed request count; done() prints one JSON line.
local paths = {%(paths)s}
local per_thread = %(per_thread)d
local threads = {}
local counter = 1

function setup(thread)
  thread:set("id", counter)
  table.insert(threads, thread)
  counter = counter + 1
end

function init(args)
  sent = 0
  answered = 0
  non2xx = 0
  idx = id
  for i, p in ipairs(paths) do paths[i] = wrk.format("GET", p) end
end

function request()
  sent = sent + 1
  idx = idx %% #paths + 1
  return paths[idx]
end

function response(status, headers, body)
  answered = answered + 1
  if status < 200 or status > 299 then non2xx = non2xx + 1 end
  if answered == per_thread then
    io.write("KSDONE\n")
    io.flush()
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local bad = 0
  local got = 0
  for _, t in ipairs(threads) do
    bad = bad + t:get("non2xx")
    got = got + t:get("answered")
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "answered": %%d, "duration_us": %%d, "non_2xx": %%d, ' ..
    '"errors": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "p999_us": %%d, ' ..
    '"max_us": %%d, "mean_us": %%f}\n',
    summary.requests, got, summary.duration, bad,
    e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max, latency.mean))
end
"""


def run_wrk(base: str, paths: list[str], *, requests: int, clients: int, threads: int,
            time_limit_s: float, workdir: Path, token: str | None = None) -> Result:
    """Drive wrk with a Lua script that stops each thread after requests/threads answers."""
    exe = shutil.which("wrk")
    if exe is None:
        raise LoadTestError("wrk is not installed (apt-get install wrk), or use --engine python")
    threads = max(1, min(threads, clients))
    per_thread = math.ceil(requests / threads)
    script = workdir / "lookups.lua"
    script.write_text(WRK_LUA % {"paths": ", ".join(json.dumps(p) for p in paths),
                                 "per_thread": per_thread})
    cmd = [exe, "-t", str(threads), "-c", str(clients), "-d", f"{int(math.ceil(time_limit_s))}s",
           "--timeout", "5s", "-s", str(script)]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    cmd.append(base + paths[0])
    # wrk sleeps for the whole -d before it reports; each thread prints KSDONE when its share is
    # answered, and SIGINT then ends the sleep, so the measured time is the load's own.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = 0
    lines: list[str] = []
    assert proc.stdout is not None
    for ln in proc.stdout:
        lines.append(ln)
        if ln.startswith("KSDONE"):
            done += 1
            if done == threads:
                proc.send_signal(signal.SIGINT)
                break
    try:
        out, err = proc.communicate(timeout=time_limit_s + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    lines.append(out)
    stdout = "".join(lines)
    line = next((ln for ln in stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise LoadTestError(f"wrk failed ({proc.returncode}): {stdout[-1500:]} {err[-1500:]}")
    d = json.loads(line[len("WRKJSON "):])
    dur = d["duration_us"] / 1e6
    return Result(
        engine="wrk", requests=d["answered"], errors=d["errors"], non_2xx=d["non_2xx"],
        duration_s=dur, req_per_s=d["answered"] / dur if dur else 0.0, clients=clients,
        latency_ms={k: d[f"{k}_us"] / 1000 for k in ("p50", "p90", "p99", "p999", "max", "mean")},
        extra={"threads": threads, "time_limited": d["answered"] < requests})


def _python_worker(args: tuple[str, list[str], int, int, float, str | None]) -> dict[str, Any]:
    """One process: `conns` keep-alive connections sharing `count` requests under asyncio."""
    import asyncio

    base, paths, count, conns, deadline, token = args

    async def main() -> dict[str, Any]:
        lat: list[float] = []
        bad = [0, 0]
        left = [count]
        limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=5, headers=headers) as c:
            async def loop(k: int) -> None:
                i = k
                while left[0] > 0 and time.time() < deadline:
                    left[0] -= 1
                    i += 1
                    t = time.perf_counter()
                    try:
                        r = await c.get(paths[i % len(paths)])
                        lat.append(time.perf_counter() - t)
                        if not 200 <= r.status_code < 300:
                            bad[1] += 1
                    except httpx.HTTPError:
                        bad[0] += 1
            await asyncio.gather(*(loop(k) for k in range(conns)))
        return {"lat": lat, "errors": bad[0], "non_2xx": bad[1]}

    return asyncio.run(main())


def run_python(base: str, paths: list[str], *, requests: int, clients: int, processes: int,
               time_limit_s: float, token: str | None = None) -> Result:
    """asyncio + httpx in several processes (spawn), clients spread over them."""
    processes = max(1, min(processes, clients))
    deadline = time.time() + time_limit_s
    shares = [(clients // processes) + (1 if i < clients % processes else 0) for i in range(processes)]
    counts = [requests // processes + (1 if i < requests % processes else 0) for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    with ctx.Pool(processes) as pool:
        parts = pool.map(_python_worker, [(base, paths, counts[i], shares[i], deadline, token)
                                          for i in range(processes)])
    dur = time.perf_counter() - t0
    lat = sorted(x for p in parts for x in p["lat"])
    if not lat:
        raise LoadTestError("no request was answered")

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q / 100 * len(lat)))] * 1000

    return Result(
        engine="python", requests=len(lat), errors=sum(p["errors"] for p in parts),
        non_2xx=sum(p["non_2xx"] for p in parts), duration_s=dur, req_per_s=len(lat) / dur,
        clients=clients,
        latency_ms={"p50": pct(50), "p90": pct(90), "p99": pct(99), "p999": pct(99.9),
                    "max": lat[-1] * 1000, "mean": sum(lat) / len(lat) * 1000},
        extra={"processes": processes, "time_limited": len(lat) < requests})


# ----------------------------------------------------------------------------- entry point
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed (with --spawn), verify, load, verify again; returns the report."""
    if args.requests < 1 or args.clients < 1 or args.time_limit <= 0:
        raise LoadTestError("--requests, --clients and --time-limit must be positive")
    engine = args.engine
    if engine == "auto":
        engine = "wrk" if shutil.which("wrk") else "python"
    server: Server | None = None
    tmp = tempfile.TemporaryDirectory(prefix="ks-load-")
    work = Path(tmp.name)
    try:
        if args.spawn:
            db_url = f"sqlite:///{work / 'load.db'}"
            from kernelsearch.db.engine import upgrade

            upgrade(db_url)
            seeded = seed_file(db_url, args.seed_file) if args.seed_file else seed_synthetic(db_url, args.device)
            server = start_server(db_url, work)
            base = server.base
        else:
            if not args.url or not args.database_url:
                raise LoadTestError("give --spawn, or both --url and --database-url")
            base = require_loopback(args.url)
            db_url = args.database_url
            seeded = 0
        lookups = build_lookups(db_url, args.device)
        verify(base, lookups, args.token)
        result = (run_wrk(base, [lk.path for lk in lookups], requests=args.requests,
                          clients=args.clients, threads=args.threads, time_limit_s=args.time_limit,
                          workdir=work, token=args.token)
                  if engine == "wrk" else
                  run_python(base, [lk.path for lk in lookups], requests=args.requests,
                             clients=args.clients, processes=args.threads,
                             time_limit_s=args.time_limit, token=args.token))
        verify(base, lookups, args.token)
    finally:
        if server is not None:
            server.stop()
        tmp.cleanup()
    report = {
        "target": {"req_per_s": 800, "p99_ms": 25},
        "passed": (result.req_per_s >= 800 and result.latency_ms["p99"] <= 25
                   and result.errors == 0 and result.non_2xx == 0),
        "lookups": {"distinct": len(lookups), "exact": sum(lk.match == "exact" for lk in lookups),
                    "nearest": sum(lk.match == "nearest" for lk in lookups),
                    "records_seeded": seeded, "verified_before_and_after": True},
        "result": result.__dict__,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "command": " ".join([_program(), *sys.argv[1:]]),
    }
    return report


def _program() -> str:
    """How this run was started, for the report: `python -m kernelsearch_tools.loadtest` when it was."""
    if Path(sys.argv[0]).resolve() == Path(__file__).resolve():
        return "python -m kernelsearch_tools.loadtest"
    return Path(sys.argv[0]).as_posix()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m kernelsearch_tools.loadtest",
                                 description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--spawn", action="store_true",
                     help="seed a private SQLite database and start the server for the run")
    src.add_argument("--url", help="a running server on loopback, e.g. http://127.0.0.1:8000")
    ap.add_argument("--database-url", help="with --url: the server's database (to learn the answers)")
    ap.add_argument("--seed-file", type=Path, help="with --spawn: a records export to import")
    ap.add_argument("--device", default=DEFAULT_DEVICE, help="device the lookups ask for")
    ap.add_argument("--requests", type=int, default=20000, help="fixed request count")
    ap.add_argument("--clients", type=int, default=16, help="keep-alive connections")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads / Python processes")
    ap.add_argument("--time-limit", type=float, default=60.0, help="hard limit of the load, seconds")
    ap.add_argument("--engine", choices=("auto", "wrk", "python"), default="auto")
    ap.add_argument("--token", help="bearer token to send (lookups need none)")
    ap.add_argument("--json", type=Path, help="write the report here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except LoadTestError as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    r = report["result"]
    lat = r["latency_ms"]
    print(f"engine={r['engine']} clients={r['clients']} requests={r['requests']} "
          f"errors={r['errors']} non_2xx={r['non_2xx']} duration={r['duration_s']:.2f}s")
    print(f"req/s={r['req_per_s']:.0f}  p50={lat['p50']:.2f} ms  p90={lat['p90']:.2f} ms  "
          f"p99={lat['p99']:.2f} ms  max={lat['max']:.2f} ms")
    print(f"lookups: {report['lookups']['distinct']} distinct "
          f"({report['lookups']['exact']} exact, {report['lookups']['nearest']} nearest), "
          f"answers verified before and after")
    print("target >= 800 req/s and p99 <= 25 ms: " + ("met" if report["passed"] else "NOT met"))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
