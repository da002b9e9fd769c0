"""`kernelsearch serve` and `kernelsearch worker`: schema check first, SIGTERM stops cleanly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from svc_helpers import free_port
from typer.testing import CliRunner

from kernelsearch.service.cli import app


def test_commands_refuse_an_unmigrated_database(sqlite_url: str) -> None:
    env = {"KS_DATABASE_URL": sqlite_url}
    runner = CliRunner()
    for args in (["worker", "--once"], ["serve", "--no-worker"]):
        res = runner.invoke(app, args, env=env)
        assert res.exit_code == 2, res.output
        assert "kernelsearch db upgrade" in res.output


def test_worker_once_with_an_empty_queue(sqlite_url: str) -> None:
    from kernelsearch.db.engine import upgrade
    from kernelsearch.service.settings import get_settings

    upgrade(sqlite_url)
    get_settings.cache_clear()
    try:
        res = CliRunner().invoke(app, ["worker", "--once"], env={"KS_DATABASE_URL": sqlite_url})
    finally:
        get_settings.cache_clear()
    assert res.exit_code == 0, res.output
    assert "no queued job" in res.output


def _run(args: list[str], url: str) -> subprocess.Popen:
    env = {**os.environ, "KS_DATABASE_URL": url, "KS_WORKER_POLL_SECONDS": "0.2",
           "KS_LOG_LEVEL": "INFO"}
    env.pop("KS_SERVICE_URL", None)
    return subprocess.Popen([sys.executable, "-m", "kernelsearch.service.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_serve_and_worker_stop_on_sigterm(sqlite_url: str) -> None:
    import httpx

    from kernelsearch.db.engine import upgrade

    upgrade(sqlite_url)
    port = free_port()
    serve = _run(["serve", "--port", str(port), "--no-worker"], sqlite_url)
    worker = _run(["worker"], sqlite_url)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert serve.poll() is None, serve.stdout.read()
                assert time.monotonic() < deadline, "serve never answered"
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["worker"] == "none"
        time.sleep(1)
        for proc in (serve, worker):
            proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has shut down gracefully.
        assert serve.wait(30) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in serve.stdout.read()
        assert worker.wait(30) == 0
        assert "stopped" in worker.stdout.read()
    finally:
        for proc in (serve, worker):
            if proc.poll() is None:
                proc.kill()


def test_ctrl_c_on_serve_exits_quietly_with_130(sqlite_url: str) -> None:
    """Ctrl-C in a terminal signals the whole foreground group: `serve` stops with status 130 and
    no traceback, and its worker child (in its own session, stopped by the API with SIGTERM)
    prints none either, even when interrupted while it is still importing."""
    import httpx

    from kernelsearch.db.engine import upgrade

    upgrade(sqlite_url)
    port = free_port()
    env = {**os.environ, "KS_DATABASE_URL": sqlite_url, "KS_LOG_LEVEL": "INFO"}
    env.pop("KS_SERVICE_URL", None)
    serve = subprocess.Popen([sys.executable, "-m", "kernelsearch.service.cli", "serve", "--port",
                              str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert serve.poll() is None, serve.stdout.read()
                assert time.monotonic() < deadline, "serve never answered"
                time.sleep(0.2)
        os.killpg(serve.pid, signal.SIGINT)
        code = serve.wait(60)
        out = serve.stdout.read()
        assert code == 130, out
        assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
