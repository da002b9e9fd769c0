"""One way to run a worker: the API's embedded thread, `serve`'s child process and `kernelsearch
worker` all run a WorkerRunner; the embedded one invalidates the API's /v1/best cache when it
writes a record; `serve` checks the schema once."""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from svc_helpers import KB, settings_for
from typer.testing import CliRunner

from kernelsearch.db.store import Store
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.service.api import create_app
from kernelsearch.service.cli import app as cli
from kernelsearch.service.settings import get_settings
from kernelsearch.service.worker_process import SCHEMA_CHECKED_FLAG, WorkerProcess
from kernelsearch.service.worker_runner import WorkerRunner, WorkerThread

pytestmark = pytest.mark.timeout(300)


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    """The commands read KS_* anew (get_settings is cached per process)."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The WorkerRunner loops entered in this process (each still runs as written)."""
    seen: list[str] = []
    for name in ("run_forever", "run_one"):
        original = getattr(WorkerRunner, name)

        def spy(self: WorkerRunner, *args: Any, _name: str = name, _orig: Any = original) -> Any:
            seen.append(_name)
            return _orig(self, *args)

        monkeypatch.setattr(WorkerRunner, name, spy)
    return seen


@pytest.fixture
def schema_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every check_schema call made in this process (each still checks)."""
    import kernelsearch.db.engine as engine
    import kernelsearch.service.app as app_module

    calls: list[str] = []
    original = engine.check_schema

    def spy(eng: Any) -> None:
        calls.append(str(eng.url))
        original(eng)

    monkeypatch.setattr(engine, "check_schema", spy)
    monkeypatch.setattr(app_module, "check_schema", spy)
    return calls


def test_each_way_of_starting_a_worker_runs_a_worker_runner(sqlite_store: Store,
                                                            runs: list[str],
                                                            schema_checks: list[str]) -> None:
    # In a thread of the API process.
    settings = settings_for(sqlite_store.url, tune_reference="none")
    app = create_app(settings, store=sqlite_store, start_worker=True)
    with TestClient(app):
        assert isinstance(app.state.worker, WorkerThread)
        assert isinstance(app.state.worker.runner, WorkerRunner)
        _wait(lambda: runs == ["run_forever"], 30, "the embedded worker's loop")
    # `kernelsearch worker`, which is also what `serve` runs as its child, told the schema is
    # checked.
    assert WorkerProcess(settings).command == [sys.executable, "-m", "kernelsearch.service.cli",
                                               "worker", SCHEMA_CHECKED_FLAG]
    env = {"KS_DATABASE_URL": sqlite_store.url}
    for args, checks in ((["worker", "--once"], 1), (["worker", "--once", SCHEMA_CHECKED_FLAG], 0)):
        runs.clear()
        schema_checks.clear()
        res = CliRunner().invoke(cli, args, env=env)
        assert res.exit_code == 0, res.output
        assert res.output.endswith("no queued job\n"), res.output
        assert runs == ["run_one"], args
        assert len(schema_checks) == checks, args


def test_a_record_of_the_embedded_worker_renews_the_cached_best_answer(sqlite_store: Store) -> None:
    """The cache would otherwise keep its answer for records_check_seconds (an hour here)."""
    settings = settings_for(sqlite_store.url, tune_reference="none", records_check_seconds=3600)
    params = {"kernel": KB, "device": INTERPRETER_DEVICE, "seq_len": 2}

    def tune(seq_len: int) -> None:
        job = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": seq_len}],
                                       "n_trials": 1, "sampler": "random"}).json()
        _wait(lambda: c.get(f"/v1/jobs/{job['id']}").json()["status"] == "succeeded", 180,
              f"the embedded worker to tune seq_len={seq_len}")

    with TestClient(create_app(settings, store=sqlite_store, start_worker=True)) as c:
        tune(1)
        before = c.get("/v1/best", params=params).json()
        assert before["match"] == "nearest" and before["case"] == {"seq_len": 1}, before
        tune(2)
        after = c.get("/v1/best", params=params).json()
        assert after["match"] == "exact" and after["case"] == {"seq_len": 2}, after


@pytest.mark.parametrize("serve_worker", ["thread", "process"])
def test_serve_checks_the_schema_once(sqlite_store: Store, schema_checks: list[str],
                                      monkeypatch: pytest.MonkeyPatch, serve_worker: str) -> None:
    """uvicorn is swapped for a TestClient that starts the app (its lifespan and worker), asks
    /healthz, and stops it."""
    import uvicorn

    served: list[Any] = []

    def run(app: Any, **_kw: Any) -> None:
        with TestClient(app, base_url="http://127.0.0.1:8123") as c:  # serve's trusted host
            assert c.get("/healthz").json()["worker"] == "embedded"
            served.append(app.state.worker)

    monkeypatch.setattr(uvicorn, "run", run)
    res = CliRunner().invoke(cli, ["serve", "--port", "8123"],
                             env={"KS_DATABASE_URL": sqlite_store.url,
                                  "KS_SERVE_WORKER": serve_worker})
    assert res.exit_code == 0, res.output
    assert len(served) == 1
    assert len(schema_checks) == 1, schema_checks
    if serve_worker == "process":  # its child does not check again
        assert served[0].command[-1] == SCHEMA_CHECKED_FLAG
