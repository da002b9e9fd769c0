"""A job whose code stops its worker (SIGSTOP to its parent, as a hostile kernel may): the
stopped worker's heartbeat stops with it, its lease expires, and another worker claims the job
and finishes it. Continued later, the stopped worker writes nothing to the job it no longer
holds: its lease is fenced. Both workers are real processes (fake_worker.py).

On PostgreSQL, the store for several workers: a worker stopped inside a transaction (its
heartbeat's, say) loses it to the server's idle-in-transaction timeout, so its row locks go
with it. On SQLite a process stopped while it holds the file's write lock blocks every other
writer until it runs again (SQLite is the single-host store), so the takeover is asserted
where it is promised."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
HERE = Path(__file__).resolve().parent
FAKE = "ks_test_scale"


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait(pred, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)
        time.sleep(0.2)


@pytest.mark.postgres
def test_a_job_that_stops_its_worker_is_taken_over_and_the_stopped_worker_writes_nothing(
        pg_url: str, tmp_path: Path) -> None:
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store
    from kernelsearch.kernels.device import INTERPRETER_DEVICE

    upgrade(pg_url)
    store = Store(pg_url)
    marker = tmp_path / "worker-stopped"
    env = {**os.environ, "KS_DATABASE_URL": pg_url, "KS_TRIAL_TIMEOUT_S": "120", "KS_MEASURE_N": "2",
           "KS_TUNE_REFERENCE": "none", "KS_WORKER_POLL_SECONDS": "0.3", "KS_HEARTBEAT_SECONDS": "0.5",
           "KS_LEASE_SECONDS": "3", "KS_FAKE_MODES": "ok", "KS_FAKE_SIGSTOP_WORKER_ONCE": str(marker)}
    env.pop("KS_SERVICE_URL", None)
    procs: dict[str, subprocess.Popen] = {}
    logs = {name: tmp_path / f"worker-{name}.log" for name in ("a", "b")}

    def start(name: str) -> subprocess.Popen:
        with logs[name].open("wb") as fh:
            procs[name] = subprocess.Popen([sys.executable, str(HERE / "fake_worker.py")],
                                           env={**env, "KS_WORKER_ID": name}, stdout=fh,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        return procs[name]

    try:
        job = store.create_job(FAKE, [{"n": 8}], 1, "grid")
        a = start("a")
        _wait(lambda: marker.exists() and _state(a.pid) == "T", 200, "the job to stop worker a",
              list(logs.values()))
        assert int(marker.read_text()) == a.pid  # the trial child's parent: the worker itself
        start("b")
        _wait(lambda: store.get_job(job.id).status in ("succeeded", "failed"), 200,
              "worker b to take the job over", list(logs.values()))
        done = store.get_job(job.id)
        assert done.status == "succeeded" and done.attempts == 2, done.error
        records = [r.as_dict() for r in store.list_records(kernel=FAKE)]
        summaries = store.trial_summaries(FAKE, INTERPRETER_DEVICE, {"n": 8})

        os.kill(a.pid, signal.SIGCONT)
        _wait(lambda: "left job" in logs["a"].read_text(), 60, "worker a to leave the job",
              list(logs.values()))
        time.sleep(2)
        assert store.get_job(job.id) == done
        assert [r.as_dict() for r in store.list_records(kernel=FAKE)] == records
        assert store.trial_summaries(FAKE, INTERPRETER_DEVICE, {"n": 8}) == summaries
        assert a.poll() is None  # worker a lives on, for the next job
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        store.close()
