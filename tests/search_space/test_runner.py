"""The trial runner types every failure and survives crashes and hangs of its child."""
from __future__ import annotations

import pytest

from kernelsearch.search_space.runner import TrialOutcome, TrialRunner

from ss_helpers import FAKE


def test_ok_trial_has_timing_and_phases(runner):
    out = runner.run(FAKE, {"n": 40}, {"MODE": "ok", "BLOCK": 16}, measure_n=3)
    assert out.ok and out.failure_kind is None
    for k in ("median_us", "min_us", "max_us", "q1_us", "q3_us", "iqr_us", "n", "method"):
        assert k in out.timing
    assert out.timing["n"] == 3 and out.timing["method"] == "interpreter-wallclock"
    assert out.timing["min_us"] <= out.timing["median_us"] <= out.timing["max_us"]
    assert set(out.rel_errors) == {"benchmark", "realistic"}
    assert max(out.rel_errors.values()) < 1e-6
    assert out.compile_s > 0 and out.check_s > 0 and out.measure_s > 0
    assert TrialOutcome.from_dict(out.as_dict()) == out


@pytest.mark.parametrize("mode, kind", [("wrong", "wrong_result"),
                                        ("compile_error", "compile_error")])
def test_typed_failures(runner, mode, kind):
    out = runner.run(FAKE, {"n": 40}, {"MODE": mode, "BLOCK": 16}, measure_n=2)
    assert not out.ok and out.failure_kind == kind
    assert out.message and out.latency_us is None


def test_invalid_config_is_typed_without_running(runner):
    out = runner.run(FAKE, {"n": 40}, {"MODE": "ok", "BLOCK": 17}, measure_n=2)
    assert out.failure_kind == "invalid_config" and "BLOCK" in out.message


def test_crash_restarts_the_child(runner):
    runner.start()
    pid = runner.pid
    out = runner.run(FAKE, {"n": 8}, {"MODE": "crash", "BLOCK": 16}, measure_n=2)
    assert out.failure_kind == "crash" and "exit code 3" in out.message
    after = runner.run(FAKE, {"n": 8}, {"MODE": "ok", "BLOCK": 16}, measure_n=2)
    assert after.ok
    assert runner.pid != pid


def test_hang_times_out_and_the_runner_survives():
    with TrialRunner(trial_timeout_s=3.0, kernel_modules=["ks_fake_kernels"]) as r:
        r.start()
        pid = r.pid
        out = r.run(FAKE, {"n": 8}, {"MODE": "hang", "BLOCK": 16}, measure_n=2)
        assert out.failure_kind == "timeout" and "3 s" in out.message
        assert r.run(FAKE, {"n": 8}, {"MODE": "ok", "BLOCK": 16}, measure_n=2).ok
        assert r.pid != pid and r.restarts == 1


def test_compile_ahead_is_off_under_the_interpreter(runner):
    assert runner.compile_workers == 0
    assert runner.prefetch(FAKE, {"n": 8}, [{"MODE": "ok", "BLOCK": 16}]) == 0
    assert runner.copy_bandwidth() is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="trial_timeout_s"):
        TrialRunner(trial_timeout_s=0)
    with pytest.raises(ValueError, match="compile_workers"):
        TrialRunner(compile_workers=-1)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed child not yet reaped still has a pid)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_cancel_kills_the_trial_in_flight_and_the_runner_survives():
    """A hanging trial (as a 2-minute trial on the interpreter) stops when cancel() turns true:
    its child process is killed, the trial raises TrialCancelled rather than reporting a failed
    config, and the next trial runs in a fresh child."""
    import threading

    from kernelsearch.search_space.runner import TrialCancelled

    with TrialRunner(trial_timeout_s=600.0, kernel_modules=["ks_fake_kernels"]) as r:
        r.start()
        pid = r.pid
        flag = threading.Event()
        timer = threading.Timer(1.0, flag.set)
        timer.start()
        try:
            with pytest.raises(TrialCancelled):
                r.run(FAKE, {"n": 8}, {"MODE": "hang", "BLOCK": 16}, measure_n=2,
                      cancel=flag.is_set)
        finally:
            timer.cancel()
        assert not _alive(pid)
        assert r.run(FAKE, {"n": 8}, {"MODE": "ok", "BLOCK": 16}, measure_n=2,
                     cancel=lambda: False).ok
        assert r.pid != pid


def test_trial_limit_fits_the_device():
    """Unset, the limit is the child's device's: under the interpreter, where one call of B takes
    seconds, it is longer than a GPU's 120 s."""
    from kernelsearch.search_space.runner import GPU_TRIAL_TIMEOUT_S, INTERPRETER_TRIAL_TIMEOUT_S

    with TrialRunner(kernel_modules=["ks_fake_kernels"]) as r:
        r.start()
        want = GPU_TRIAL_TIMEOUT_S if r.on_gpu else INTERPRETER_TRIAL_TIMEOUT_S
        assert r.trial_timeout_s == want
    assert TrialRunner(trial_timeout_s=7).trial_timeout_s == 7


def test_a_registered_module_the_child_cannot_import_costs_only_its_kernels(monkeypatch):
    """A kernel registered here from a module the child cannot import (loaded from a path this
    process has since dropped) leaves the child running every other kernel; a module named in
    `kernel_modules` that fails still stops the child, naming it."""
    from kernelsearch.kernels import registry

    monkeypatch.setattr(registry, "plugin_modules", lambda: ["ks_no_longer_on_the_path"])
    with TrialRunner(trial_timeout_s=20.0, kernel_modules=["ks_fake_kernels"]) as r:
        assert r.registered_modules == ("ks_no_longer_on_the_path",)
        assert r.run(FAKE, {"n": 8}, {"MODE": "ok", "BLOCK": 16}, measure_n=2).ok
    with TrialRunner(trial_timeout_s=20.0, kernel_modules=["ks_no_longer_on_the_path"]) as r:
        with pytest.raises(RuntimeError, match="died while starting"):
            r.start()


def test_a_child_allocating_past_its_memory_bound_fails_its_trial_not_the_worker(monkeypatch):
    """KS_TRIAL_MAX_MEMORY_BYTES bounds the trial child's data (RLIMIT_DATA): a candidate that
    allocates more fails its trial saying so (typed a crash, as any failed allocation is: the
    child is replaced) and the runner goes on to the next trial. Without
    the bound, the 8 GiB (never touched) was overcommitted and the trial passed."""
    import ks_memory_hog

    from kernelsearch.search_space.trial_child import MEMORY_ENV

    monkeypatch.setenv(MEMORY_ENV, str(4 << 30))
    with TrialRunner(trial_timeout_s=60.0, kernel_modules=["ks_memory_hog"]) as r:
        r.start()
        out = r.run(ks_memory_hog.NAME, {"n": 8}, {"MODE": "ok", "BLOCK": 16}, measure_n=2)
        assert not out.ok and "out of host memory" in out.message and MEMORY_ENV in out.message, out
        assert r.run(FAKE, {"n": 8}, {"MODE": "ok", "BLOCK": 16}, measure_n=2).ok
