"""The worker loop end to end on SQLite under the Triton interpreter: tiny cases, 2-3 trials.

Real tuner, real trial runner child, real database: the record a job leaves is looked up through
the API, a job abandoned by its worker is resumed by another without losing or repeating a
trial, and a cancelled job stops.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from svc_helpers import KB, settings_for

from kernelsearch.db.store import Store
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.search_space.runner import TrialRunner
from kernelsearch.service.api import create_app
from kernelsearch.service.worker import Worker

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runner() -> Iterator[TrialRunner]:
    """One child process for the module's workers (starting one costs seconds)."""
    r = TrialRunner(trial_timeout_s=120)
    try:
        yield r
    finally:
        r.close()


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _evaluated(store: Store, axes: dict) -> list[int]:
    """Trial numbers the study evaluated (ok or failed), from the store's trial summaries."""
    rows = store.trial_summaries(KB, INTERPRETER_DEVICE, axes)
    return sorted(r["trial_number"] for r in rows if r["state"] in ("complete", "fail"))


def test_job_tuned_end_to_end_and_served(sqlite_store: Store, runner: TrialRunner) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none")
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        job = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 2}, {"seq_len": 3}],
                                       "n_trials": 2, "sampler": "random"}).json()
        worker = Worker(settings, sqlite_store, runner=runner)
        assert worker.run_one() is True
        assert worker.run_one() is False  # nothing left in the queue
        done = c.get(f"/v1/jobs/{job['id']}").json()
        assert done["status"] == "succeeded", done
        assert done["trials_done"] == 4
        assert done["device"] == INTERPRETER_DEVICE
        assert [b["axes"] for b in done["best"]["cases"]] == [{"seq_len": 2}, {"seq_len": 3}]
        best = c.get("/v1/best", params={"kernel": KB, "device": INTERPRETER_DEVICE,
                                         "seq_len": 3}).json()
        assert best["match"] == "exact"
        assert best["timing_method"] == "interpreter-wallclock"
        assert best["config"] == done["best"]["cases"][1]["best_config"]
        assert best["job_id"] == job["id"]
        # A shape nobody tuned gets the nearest tuned case.
        near = c.get("/v1/best", params={"kernel": KB, "device": INTERPRETER_DEVICE,
                                         "seq_len": 50}).json()
        assert near["match"] == "nearest" and near["case"] == {"seq_len": 3}
        assert len(_evaluated(sqlite_store, {"seq_len": 2})) == 2
        html = c.get("/case", params={"kernel": KB, "device": INTERPRETER_DEVICE, "seq_len": 2}).text
        assert "Optimisation history" in html and "trial latency" in html
        assert "2 trials" in html and f'href="/jobs/{job["id"]}"' in html  # the trials name their job


def test_abandoned_job_resumed_by_another_worker(sqlite_store: Store, runner: TrialRunner) -> None:
    """Worker A is told to stop mid-job: it hands the job back to the queue at once (not after
    its lease), and B resumes its study."""
    settings = settings_for(sqlite_store.url, tune_reference="none", lease_seconds=1.0,
                            heartbeat_seconds=0.2)
    job = sqlite_store.create_job(KB, [{"seq_len": 4}], 3, "random")
    a = Worker(settings, sqlite_store, runner=runner, owner="worker-a")
    stop_a = threading.Event()
    a.stop_event = stop_a
    t = threading.Thread(target=a.run_one)
    t.start()
    _wait(lambda: sqlite_store.get_job(job.id).trials_done >= 1, 120, "A's first trial")
    stop_a.set()
    t.join(120)
    left = sqlite_store.get_job(job.id)
    assert left.status == "queued" and left.owner is None and left.heartbeat_at is None
    done_by_a = left.trials_done
    assert 1 <= done_by_a < 3
    b = Worker(settings, sqlite_store, runner=runner, owner="worker-b")
    _wait(lambda: b.run_one() or sqlite_store.get_job(job.id).status == "succeeded", 120,
          "B to claim the handed-back job")
    final = sqlite_store.get_job(job.id)
    assert final.status == "succeeded" and final.owner == "worker-b" and final.attempts == 2
    assert final.trials_done == 3
    trials = _evaluated(sqlite_store, {"seq_len": 4})
    assert len(trials) == 3 and len(set(trials)) == 3  # none lost, none counted twice


@pytest.mark.slow
def test_killed_worker_process_is_replaced(sqlite_store: Store, runner: TrialRunner,
                                           tmp_path) -> None:
    """SIGKILL a `kernelsearch worker` mid-job; another worker resumes its study."""
    job = sqlite_store.create_job(KB, [{"seq_len": 5}], 3, "random")
    env = {**os.environ, "KS_DATABASE_URL": sqlite_store.url, "KS_LEASE_SECONDS": "2",
           "KS_HEARTBEAT_SECONDS": "0.5", "KS_MEASURE_N": "2", "KS_TUNE_REFERENCE": "none",
           "KS_WORKER_ID": "doomed", "KS_API_TOKEN": ""}
    env.pop("KS_SERVICE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "kernelsearch.service.cli", "worker", "--once"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "w.log", "wb"),
                            start_new_session=True)
    try:
        _wait(lambda: sqlite_store.get_job(job.id).trials_done >= 1 or proc.poll() is not None,
              180, "the worker process's first trial")
        assert proc.poll() is None, (tmp_path / "w.log").read_text()[-2000:]
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and its trial child
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    settings = settings_for(sqlite_store.url, tune_reference="none", lease_seconds=2.0)
    b = Worker(settings, sqlite_store, runner=runner, owner="survivor")
    _wait(lambda: b.run_one() or sqlite_store.get_job(job.id).status == "succeeded", 120,
          "the survivor to claim the job")
    final = sqlite_store.get_job(job.id)
    assert final.status == "succeeded" and final.owner == "survivor"
    trials = _evaluated(sqlite_store, {"seq_len": 5})
    assert final.trials_done == 3 and len(trials) == 3


def test_cancel_stops_a_running_job(sqlite_store: Store, runner: TrialRunner) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none", heartbeat_seconds=0.2)
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        job = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 6}, {"seq_len": 7}],
                                       "n_trials": 50, "sampler": "random"}).json()
        w = Worker(settings, sqlite_store, runner=runner)
        t = threading.Thread(target=w.run_one)
        t.start()
        _wait(lambda: c.get(f"/v1/jobs/{job['id']}").json()["trials_done"] >= 1, 120,
              "the first trial")
        r = c.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        t.join(120)
        assert not t.is_alive()
        final = c.get(f"/v1/jobs/{job['id']}").json()
        assert final["status"] == "cancelled" and final["trials_done"] < 100
        assert c.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    # The case that ran when the job was cancelled stored its record: the job reports it.
    (rec,) = [r for r in sqlite_store.list_records(KB, INTERPRETER_DEVICE) if r.axes == {"seq_len": 6}]
    (case,) = final["best"]["cases"]
    assert case["axes"] == {"seq_len": 6} and case["stopped_because"] == "cancelled"
    assert case["best_latency_us"] == rec.latency_median_us and case["best_config"] == rec.config


def test_job_timeout_fails_with_a_message(sqlite_store: Store, runner: TrialRunner) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none")
    job = sqlite_store.create_job(KB, [{"seq_len": 8}, {"seq_len": 9}], 1000, "random",
                                  timeout_s=0.5)
    assert Worker(settings, sqlite_store, runner=runner).run_one()
    final = sqlite_store.get_job(job.id)
    assert final.status == "failed" and "timed out after 0.5 s" in final.error


def test_embedded_worker_runs_queued_jobs(sqlite_store: Store) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none")
    with TestClient(create_app(settings, store=sqlite_store, start_worker=True)) as c:
        assert c.get("/healthz").json()["worker"] == "embedded"
        job = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 1}],
                                       "n_trials": 1, "sampler": "random"}).json()
        _wait(lambda: c.get(f"/v1/jobs/{job['id']}").json()["status"] == "succeeded", 180,
              "the embedded worker")
        assert 'ks_jobs_finished_total{status="succeeded"} 1.0' in c.get("/metrics").text
        best = c.get("/v1/best", params={"kernel": KB, "device": INTERPRETER_DEVICE,
                                         "seq_len": 1})
        assert best.status_code == 200 and best.json()["match"] == "exact"


def test_a_job_without_any_valid_config_says_why(sqlite_store: Store, runner: TrialRunner) -> None:
    """Every trial passes its limit: the job fails naming the failure kind, count and message.
    A later job on the case adds its own trials (the failed ones do not use up its budget)."""
    settings = settings_for(sqlite_store.url, tune_reference="none", trial_timeout_s=0.01)
    job = sqlite_store.create_job(KB, [{"seq_len": 2}], 2, "random")
    w = Worker(settings, sqlite_store)
    try:
        assert w.run_one()
    finally:
        w.close()
    final = sqlite_store.get_job(job.id)
    assert final.status == "failed", final
    assert "timeout 2" in final.error and "trial exceeded 0.01 s" in final.error, final.error
    assert final.trials_done == 2
    again = sqlite_store.create_job(KB, [{"seq_len": 2}], 1, "random")
    assert Worker(settings_for(sqlite_store.url, tune_reference="none"), sqlite_store,
                  runner=runner).run_one()
    final = sqlite_store.get_job(again.id)
    assert final.status == "succeeded" and final.trials_done == 1, final
    assert len(_evaluated(sqlite_store, {"seq_len": 2})) == 3


def test_cancel_kills_the_running_trial_of_a_worker_process(sqlite_store: Store,
                                                            tmp_path) -> None:
    """POST /v1/jobs/{id}/cancel while `kernelsearch worker --once` is inside a trial that would
    run for hours: the worker kills the trial's child and exits within seconds (before, it
    computed until the trial's end or its limit, 600 s under the interpreter)."""
    import optuna
    from optuna.trial import TrialState

    from kernelsearch.search_space.tuner import study_name

    axes = {"seq_len": 2}
    job = sqlite_store.create_job(KB, [axes], 3, "random")
    env = {**os.environ, "KS_DATABASE_URL": sqlite_store.url, "KS_MEASURE_N": "10000000",
           "KS_TUNE_REFERENCE": "none", "KS_CANCEL_POLL_SECONDS": "0.2", "KS_API_TOKEN": ""}
    env.pop("KS_SERVICE_URL", None)
    env.pop("KS_TRIAL_TIMEOUT_S", None)
    log = tmp_path / "w.log"
    proc = subprocess.Popen([sys.executable, "-m", "kernelsearch.service.cli", "worker", "--once"],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
                            start_new_session=True)
    name = study_name(KB, axes, INTERPRETER_DEVICE)

    def in_a_trial() -> bool:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            study = optuna.load_study(study_name=name, storage=sqlite_store.url)
        except KeyError:
            return False
        return any("ks_config" in t.user_attrs
                   for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    try:
        _wait(in_a_trial, 180, "the worker's first trial")
        settings = settings_for(sqlite_store.url, tune_reference="none")
        with TestClient(create_app(settings, store=sqlite_store)) as c:
            assert c.post(f"/v1/jobs/{job.id}/cancel").json()["status"] == "cancelled"
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker still computes the cancelled job's trial")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, log.read_text()[-2000:]
    assert "cancelled" in log.read_text()
    final = sqlite_store.get_job(job.id)
    assert final.status == "cancelled" and final.trials_done == 0
    study = optuna.load_study(study_name=name, storage=sqlite_store.url)
    # The killed trial is no failed config: it is queued again for a later job.
    assert not _evaluated(sqlite_store, axes)
    assert any(t.state == TrialState.WAITING for t in study.trials)


def test_the_worker_runs_each_kind_of_job_with_its_own_handler(sqlite_store: Store, monkeypatch) -> None:
    """The job's kind decides, not its sampler or what its capture holds: a declared kernel's
    job whose sampler is "search" is still tuned as a declared kernel's."""
    from kernelsearch.db.statuses import JobKind, JobStatus

    ran: list[tuple[str, int]] = []
    for handler in ("_run_declared_job", "_run_capture_job", "_run_search_job", "_run_helion_job"):
        monkeypatch.setattr(Worker, handler, lambda self, job, held, lease, _h=handler:
                            (ran.append((_h, job.id)), (JobStatus.SUCCEEDED, None))[1])
    worker = Worker(settings_for(sqlite_store.url), sqlite_store, owner="w")
    jobs = {kind: sqlite_store.queue_job(KB, [{"seq_len": 2}], 1, sampler, capture=capture)[0]
            for kind, sampler, capture in [(JobKind.DECLARED, "search", None),
                                           (JobKind.CAPTURE, "tpe", {"c": 1}),
                                           (JobKind.SEARCH, "search", {"c": 1}),
                                           (JobKind.HELION, "tpe", {"kind": "helion"})]}
    for kind, job in jobs.items():
        assert job.kind == kind
        worker._run_job(job, None, None)  # type: ignore[arg-type]
    assert ran == [("_run_declared_job", jobs[JobKind.DECLARED].id), ("_run_capture_job", jobs[JobKind.CAPTURE].id),
                   ("_run_search_job", jobs[JobKind.SEARCH].id), ("_run_helion_job", jobs[JobKind.HELION].id)]
