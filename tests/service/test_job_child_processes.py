"""The job child (service.job_child) and the trial child start clean for CUDA and take their
processes with them: each is a spawned child of the worker (never a fork of a process that
probed CUDA, which torch marks a "bad fork" unable to use it), leads its own session, and the
processes its code started are killed when the job ends, however it ends."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ks_hostile_job
from kernelsearch.search_space.runner import TrialRunner
from kernelsearch.service.job_child import JobChildFailed, JobChildStopped, run_in_child

pytestmark = pytest.mark.timeout(300)
HERE = Path(__file__).parent


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether `pid` has ended (a zombie left to an init that does not reap counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_the_job_child_is_a_spawned_child_of_the_worker_leading_its_own_session() -> None:
    """No fork server in between (whose preloads may have probed CUDA): the child's parent is
    the caller, and it leads its own session and process group."""
    where = run_in_child(ks_hostile_job.where_am_i)
    assert where["ppid"] == os.getpid()
    assert where["pid"] == where["pgid"] == where["sid"]


def test_a_job_child_of_a_worker_that_probed_cuda_is_not_a_bad_fork(tmp_path: Path) -> None:
    """torch's poison_fork, as a fake: a parent that probed CUDA marks every child it forks a
    bad fork. The job child, started after the worker probed, is not one (spawn semantics)."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(HERE)!r})
        import torch
        os.register_at_fork(after_in_child=lambda: setattr(torch.cuda, "_is_in_bad_fork", lambda: True))
        torch.cuda.is_available(); torch.cuda.device_count()
        import ks_hostile_job
        from kernelsearch.service.job_child import run_in_child
        assert run_in_child(ks_hostile_job.cuda_poisoned) is False
        print("clean")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr


@pytest.mark.parametrize("how", ["fork", "popen"])
@pytest.mark.parametrize("ending", ["returns", "raises", "stopped", "timed_out"])
def test_what_a_job_child_started_ends_with_the_job(tmp_path: Path, how: str, ending: str) -> None:
    pid_file = tmp_path / "grandchild.pid"
    fn = {"returns": ks_hostile_job.returns, "raises": ks_hostile_job.raises}.get(ending, ks_hostile_job.hangs)
    if ending == "returns":
        grandchild = run_in_child(fn, str(pid_file), how)
    elif ending == "raises":
        with pytest.raises(JobChildFailed):
            run_in_child(fn, str(pid_file), how)
    else:
        with pytest.raises(JobChildStopped):
            run_in_child(fn, str(pid_file), how, stop=pid_file.exists if ending == "stopped" else None,
                         limit_s=60.0 if ending == "stopped" else 20.0)
    grandchild = int(pid_file.read_text())
    assert _gone(grandchild), f"grandchild {grandchild} outlived its job ({ending})"


@pytest.mark.parametrize("how", ["fork", "popen"])
def test_what_a_job_child_started_ends_with_a_worker_killed_by_sigkill(tmp_path: Path, how: str) -> None:
    """No cleanup runs in a worker killed with SIGKILL: its job child dies with it (parent-death
    signal), and the child's group guard kills what the child started."""
    pid_file = tmp_path / "grandchild.pid"
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import ks_hostile_job
        from kernelsearch.service.job_child import run_in_child
        if __name__ == "__main__":
            run_in_child(ks_hostile_job.hangs, {str(pid_file)!r}, {how!r})
    """))
    worker = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert worker.poll() is None and time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        time.sleep(0.2)  # the pid is written
    finally:
        worker.kill()
        worker.wait(10)
    grandchild = int(pid_file.read_text())
    assert _gone(grandchild), f"grandchild {grandchild} outlived its worker"


def test_the_trial_child_leads_its_own_session_and_its_group_ends_with_it() -> None:
    runner = TrialRunner(trial_timeout_s=60.0)
    try:
        runner.start()
        pid = runner.pid
        assert pid is not None
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid
    finally:
        runner.close()
    assert _gone(pid)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a child's use of CUDA "
                    "after its parent probed it is checked there")
def test_on_a_gpu_the_job_child_and_the_trial_child_use_cuda_after_the_worker_probed_it() -> None:
    from kernelsearch.kernels.device import default_device, device_name

    torch.cuda.init()
    assert torch.cuda.device_count() > 0 and default_device().type == "cuda"
    assert run_in_child(ks_hostile_job.cuda_sum) == 4.0
    with TrialRunner(trial_timeout_s=120.0) as runner:
        runner.start()
        assert runner.on_gpu and runner.device_name == device_name()
        assert runner.copy_bandwidth() is not None
