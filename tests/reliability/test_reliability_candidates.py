"""Misbehaving candidates inside a real worker process: a config that hangs is timed out, one
that kills its process (os._exit, as a segfault or a CUDA illegal access would) is a failed
trial; the worker process lives on, finishes the job and takes the next one."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
FAKE = "ks_test_scale"


def _wait_final(store, job_id: int, proc: subprocess.Popen, log: Path, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            return job
        assert proc.poll() is None, f"worker died ({proc.returncode}):\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not finished in {timeout} s:\n{log.read_text()[-3000:]}")


def test_hanging_and_crashing_candidates_do_not_take_the_worker_down(sqlite_url, tmp_path):
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store
    from kernelsearch.kernels.device import INTERPRETER_DEVICE

    upgrade(sqlite_url)
    store = Store(sqlite_url)
    log = tmp_path / "worker.log"
    env = {**os.environ, "KS_DATABASE_URL": sqlite_url, "KS_TRIAL_TIMEOUT_S": "4",
           "KS_MEASURE_N": "2", "KS_TUNE_REFERENCE": "none", "KS_WORKER_POLL_S": "0.3",
           "KS_HEARTBEAT_S": "0.5", "KS_FAKE_MODES": "crash,hang,ok"}
    env.pop("KS_SERVICE_URL", None)
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, str(HERE / "fake_worker.py")], env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        job = store.create_job(FAKE, [{"n": 8}], 3, "grid")
        final = _wait_final(store, job.id, proc, log, 200)
        assert final.status == "succeeded", (final.error, log.read_text()[-3000:])
        assert final.trials_done == 3

        rows = store.trial_summaries(FAKE, INTERPRETER_DEVICE, {"n": 8})
        kinds = {r["config"]["MODE"]: r["failure_kind"] for r in rows}
        assert kinds == {"crash": "crash", "hang": "timeout", "ok": None}
        messages = {r["config"]["MODE"]: r["message"] or "" for r in rows}
        assert messages["crash"] and messages["hang"], "a failed trial says why"
        (rec,) = store.list_records(kernel=FAKE)
        assert rec.config["MODE"] == "ok" and rec.n_failed == 2

        # The same process takes the next job: it was never taken down.
        nxt = store.create_job(FAKE, [{"n": 16}], 3, "grid")
        assert _wait_final(store, nxt.id, proc, log, 200).status == "succeeded"
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        store.close()
    assert proc.returncode == 0, log.read_text()[-3000:]
