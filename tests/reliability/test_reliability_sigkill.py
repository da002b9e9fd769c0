"""A worker killed with SIGKILL in the middle of a job: after its lease the other worker resumes
the job and the study ends with exactly the asked trials, none lost, none counted twice.

Both workers are real `kernelsearch worker` processes started with the compose file's command;
the kill takes the worker's whole process group (it and its trial child), as `docker kill` does.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ks_stack import Stack
from rel_faults import KERNEL, case

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# Workload A's small case (about a second a trial): the test is about the job's lease and the
# study's trial count, not the kernel, and B's trials took several times longer.
AXES = case(3)
N_TRIALS = 4


def _wait(pred, timeout: float, what: str, stack: Stack) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{stack.logs()}"
        time.sleep(0.1)


def test_sigkilled_worker_job_resumed_exactly(sqlite_url, tmp_path):
    """On SQLite only: the same SIGKILL-and-resume runs on PostgreSQL in test_reliability_faults'
    takeover test (A killed mid-trial, B resumes, every trial counted once), and the store
    contract suite proves both backends' lease and claim calls; this is process behaviour."""
    db_url = sqlite_url
    from kernelsearch.db.store import Store
    from kernelsearch.kernels.device import INTERPRETER_DEVICE
    from kernelsearch.search_space.tuner import A_CONFIG, A_RUN, study_name

    stack = Stack(tmp_path, {
        "KS_DATABASE_URL": db_url, "KS_MEASURE_N": "2", "KS_TUNE_REFERENCE": "none",
        "KS_LEASE_S": "3", "KS_HEARTBEAT_S": "0.5", "KS_WORKER_POLL_S": "0.3",
    })
    store = None
    try:
        migrate = stack.run_once("migrate")
        assert migrate.returncode == 0, migrate.stderr
        store = Store(db_url)
        job = store.create_job(KERNEL, [AXES], N_TRIALS, "random")
        workers = {name: stack.start("worker", name=name, extra_env={"KS_WORKER_ID": name})
                   for name in ("worker-a", "worker-b")}

        # Mid-job: the owner has finished at least one trial and is busy with the next.
        _wait(lambda: (j := store.get_job(job.id)).status == "running" and j.trials_done >= 1,
              240, "a worker's first trial", stack)
        victim_name = store.get_job(job.id).owner
        assert victim_name in workers
        victim = workers.pop(victim_name)
        (survivor_name, survivor), = workers.items()
        os.killpg(victim.popen.pid, signal.SIGKILL)
        victim.popen.wait(30)
        done_before = store.get_job(job.id).trials_done
        assert done_before < N_TRIALS, "the job ended before the kill: nothing was tested"

        _wait(lambda: store.get_job(job.id).status in ("succeeded", "failed"), 300,
              "the survivor to finish the job", stack)
        final = store.get_job(job.id)
        assert final.status == "succeeded", (final.error, stack.logs())
        assert final.owner == survivor_name and final.attempts == 2
        assert final.trials_done == N_TRIALS
        assert survivor.alive()

        # Optuna's own storage: exactly N_TRIALS evaluated trials, each config once.
        study = optuna.load_study(study_name=study_name(KERNEL, AXES, INTERPRETER_DEVICE),
                                  storage=db_url)
        evaluated = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                     if t.user_attrs.get(A_RUN)]
        assert len(evaluated) == N_TRIALS
        configs = {json.dumps(t.user_attrs[A_CONFIG], sort_keys=True) for t in evaluated}
        assert len(configs) == N_TRIALS, "a config was evaluated twice"
        # The victim's in-flight trial may still read RUNNING (Optuna fails it as stale only
        # after its own grace period); it was never evaluated, so it counts for nothing.
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        assert len(running) <= 1 and not any(t.user_attrs.get(A_RUN) for t in running)
        summaries = [r for r in store.trial_summaries(KERNEL, INTERPRETER_DEVICE, AXES)
                     if r["state"] in ("complete", "fail")]
        assert sorted(r["trial_number"] for r in summaries) == sorted(t.number for t in evaluated)
        # The record counts the same trials.
        (rec,) = store.list_records(kernel=KERNEL, device=INTERPRETER_DEVICE)
        assert rec.n_trials == N_TRIALS
    finally:
        stack.close()
        if store is not None:
            store.close()


def _children(pid: int) -> list[int]:
    """The pids `pid`'s threads started (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _dead(pid: int) -> bool:
    """Gone, or a zombie no one reaps yet (its parent was killed)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.timeout(180)
def test_sigkilled_worker_takes_its_trial_child_with_it(sqlite_url, tmp_path):
    """Issue 24.7: kill -9 of the worker alone (not its process group) while its trial child
    runs a kernel that hangs: the child is gone within a second (a parent-death signal), not
    left running with nobody to end it."""
    import ks_fake_kernels

    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store
    from kernelsearch.kernels.device import INTERPRETER_DEVICE
    from kernelsearch.search_space.tuner import study_name

    from rel_faults import Procs, wait_for

    upgrade(sqlite_url)
    axes = {"n": 64}
    procs = Procs(tmp_path, {"KS_DATABASE_URL": sqlite_url, "KS_FAKE_MODES": "hang"})
    child = None
    try:
        with Store(sqlite_url) as store:
            store.create_job(ks_fake_kernels.NAME, [axes], 1, "random")
        worker = procs.worker("hung", fake=True)
        name = study_name(ks_fake_kernels.NAME, axes, INTERPRETER_DEVICE)

        def running() -> bool:
            try:
                study = optuna.load_study(study_name=name, storage=sqlite_url)
            except KeyError:
                return False
            return bool(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

        wait_for(running, 150, "the worker's first trial", procs, every=0.3)
        (child,) = [c for c in _children(worker.popen.pid)
                    if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
        time.sleep(1.0)  # the trial's request reaches the child: it is inside the hung kernel
        assert not _dead(child)
        os.kill(worker.popen.pid, signal.SIGKILL)
        worker.popen.wait(10)
        deadline = time.monotonic() + 1.0
        while not _dead(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _dead(child), "the trial child outlived its killed worker"
    finally:
        if child is not None and not _dead(child):
            os.kill(child, signal.SIGKILL)
        procs.close()
