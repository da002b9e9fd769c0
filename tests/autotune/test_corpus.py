"""The corpus of real libraries' kernel shapes (corpus_pkg), run as a user program: with
`triton.autotune`, then with the decorator swapped on a first host (tunes, shares through a live
service) and a fresh second host (served, nothing benchmarked), then swapped under faults (a
service answering HTML or 500, a garbage, a read-only and a full local store). Every swapped run
must give triton.autotune's outputs with no error reaching the call.

Four fresh processes in all, each running every entry (corpus_run.py); the assertions are
parametrized over what they print. Under pytest-xdist the runs happen once, in whichever worker
asks first, and the other reads their results."""
from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from at_env import HERE, child_env
from corpus_pkg import ENTRIES
from svc_helpers import LiveServer, settings_for

pytestmark = [pytest.mark.timeout(600)]

FAULTS = ("service_html", "service_500", "store_garbage", "store_readonly", "disk_full")


def _short(entry: str) -> str:
    return entry.rsplit(".", 1)[-1]


PARAMS = [pytest.param(e, id=_short(e)) for e in ENTRIES]


class _Answering(BaseHTTPRequestHandler):
    """Every request answered with one status and an HTML page (a proxy's error or login page)."""

    status = 200

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b"<html><body><h1>Sign in</h1></body></html>"
        self.send_response(self.status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _html_server(status: int) -> Iterator[str]:
    handler = type(f"Answering{status}", (_Answering,), {"status": status})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _migrated(path: Path) -> str:
    from kernelsearch.db.engine import upgrade

    url = f"sqlite:///{path}"
    upgrade(url)
    return url


@contextlib.contextmanager
def _mounted(*args: str) -> Iterator[bool]:
    """A mount for the faults' run (the tests run as root in CI); False when mounting is refused."""
    target = args[-1]
    ok = subprocess.run(["mount", *args], capture_output=True).returncode == 0
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", target], capture_output=True)


@contextlib.contextmanager
def _fault_envs(work: Path) -> Iterator[dict[str, dict[str, str]]]:
    """Each fault's KS_* environment, with what it needs up for the run."""
    base = {"KS_AUTOTUNE_FALLBACK": "tune", "KS_DATABASE_URL": f"sqlite:///{work / 'absent.db'}"}
    garbage = work / "garbage.db"
    garbage.write_bytes(random.Random(0).randbytes(8192))
    ro_src, ro_dir, full_dir = work / "ro_src", work / "ro", work / "full"
    for d in (ro_src, ro_dir, full_dir):
        d.mkdir()
    _migrated(ro_src / "ks.db")
    with _html_server(200) as html, _html_server(500) as err500, \
            _mounted("--bind", str(ro_src), str(ro_dir)) as bound, \
            _mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full_dir)) as tmpfs:
        envs = {"service_html": {**base, "KS_SERVICE_URL": html},
                "service_500": {**base, "KS_SERVICE_URL": err500},
                "store_garbage": {**base, "KS_DATABASE_URL": f"sqlite:///{garbage}"}}
        # Root writes through file modes: only a read-only mount makes the store read-only.
        if bound and subprocess.run(["mount", "-o", "remount,ro,bind", str(ro_dir)]).returncode == 0:
            envs["store_readonly"] = {**base, "KS_DATABASE_URL": f"sqlite:///{ro_dir / 'ks.db'}"}
        if tmpfs:
            full_url = _migrated(full_dir / "ks.db")
            with contextlib.suppress(OSError), open(full_dir / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
            envs["disk_full"] = {**base, "KS_DATABASE_URL": full_url}
        yield envs


def _run(mode: str, out: Path, env: dict[str, str], *extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(HERE / "corpus_run.py"), mode, str(out), *extra],
                          env=env, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (out.parent / f"{out.stem}.stderr.txt").write_text(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _produce(work: Path) -> dict:
    """The four runs; returns their summaries (outputs are in WORK/*.pt)."""
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store
    from kernelsearch.service.api import create_app

    env = child_env(KS_AUTOTUNE_FALLBACK="tune")
    got = {"triton": _run("triton", work / "triton.pt", env)}
    url = f"sqlite:///{work / 'service.db'}"
    upgrade(url)
    with Store(url) as store, LiveServer(create_app(settings_for(url), store=store)) as srv:
        served = child_env(KS_AUTOTUNE_FALLBACK="tune", KS_SERVICE_URL=srv.url,
                           KS_DATABASE_URL=f"sqlite:///{work / 'absent.db'}")
        got["first"] = _run("ks", work / "first.pt", served)
        got["second"] = _run("ks", work / "second.pt", served)
    with _fault_envs(work) as envs:
        spec = work / "faults.json"
        spec.write_text(json.dumps(envs))
        got["faults"] = _run("faults", work / "faults.pt", child_env(), str(spec))
    got["faults_run"] = sorted(envs)
    return got


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The runs' folder and summaries, made once per test session (across xdist workers)."""
    from filelock import FileLock

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        work = tmp_path_factory.mktemp("corpus")
        return work, _produce(work)
    work = tmp_path_factory.getbasetemp().parent / "corpus"
    with FileLock(str(work) + ".lock"):
        done = work / "summary.json"
        if not done.exists():
            work.mkdir(exist_ok=True)
            done.write_text(json.dumps(_produce(work)))
    return work, json.loads(done.read_text())


def _outputs(work: Path, name: str) -> dict:
    return torch.load(work / f"{name}.pt", weights_only=True)


def _same_as_triton(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        torch.testing.assert_close(got[name], t, msg=lambda m: f"output {name!r}: {m}")


def test_every_entry_runs_under_triton_autotune(corpus) -> None:
    work, got = corpus
    assert {e: s["error"] for e, s in got["triton"].items() if s["error"]} == {}
    assert all(s["benched"] >= 2 for s in got["triton"].values())
    assert os.path.getsize(work / "triton.pt") > 0


@pytest.mark.parametrize("entry", PARAMS)
def test_first_host_gives_tritons_result_and_tunes(corpus, entry: str) -> None:
    work, got = corpus
    s = got["first"][entry]
    assert s["error"] is None, s["error"]
    _same_as_triton(_outputs(work, "first")[entry], _outputs(work, "triton")[entry])
    assert s["sources"] and set(s["sources"]) == {"tuned_here"}
    assert s["benched"] == got["triton"][entry]["benched"]


@pytest.mark.parametrize("entry", PARAMS)
def test_fresh_process_is_served_with_no_benchmark(corpus, entry: str) -> None:
    work, got = corpus
    s = got["second"][entry]
    assert s["error"] is None, s["error"]
    _same_as_triton(_outputs(work, "second")[entry], _outputs(work, "triton")[entry])
    assert s["sources"] and set(s["sources"]) == {"service"}, s["sources"]
    assert s["benched"] == 0


@pytest.mark.parametrize("fault,entry", [
    pytest.param(f, e, id=f"{f}-{_short(e)}") for f in FAULTS for e in ENTRIES])
def test_a_fault_gives_tritons_result(corpus, fault: str, entry: str) -> None:
    work, got = corpus
    if fault not in got["faults_run"]:
        pytest.skip(f"{fault}: this machine refuses the mount it needs (a read-only bind, a tmpfs)")
    s = got["faults"][fault][entry]
    assert s["error"] is None, s["error"]
    _same_as_triton(_outputs(work, "faults")[fault][entry], _outputs(work, "triton")[entry])
