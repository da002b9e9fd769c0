"""The GPU never waits on the compiler: the compile-ahead pool starts with the runner and compiles
on shaped inputs, the child keeps a case's draws, and the tuner asks (and prefetches) the next
trials and the next case before it needs them.

Under the interpreter the pool is off; `_CpuPoolRunner` turns it on, so "compiling" a config in
the pool runs it on the CPU, which exercises the same bookkeeping.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping

import optuna
import pytest
from optuna.trial import TrialState

import ks_fake_kernels
import ks_probe_kernels as probe
from kernelsearch.kernels.check import InputCache, check_config
from kernelsearch.search_space import runner as runner_mod
from kernelsearch.search_space.runner import TrialOutcome, TrialRunner
from kernelsearch.search_space.space import SearchSpace
from kernelsearch.search_space.tuner import TuneHooks, TuneOptions, tune_case

from ss_helpers import FAKE

PROBE = probe.NAME
OK = {"MODE": "ok", "BLOCK": 16}


@pytest.fixture
def probe_log(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "probe.log")
    open(path, "w").close()
    monkeypatch.setenv(probe.LOG_ENV, path)
    return path


def _count(events, name: str, detail: str | None = None) -> int:
    return sum(1 for e in events if e[0] == name and (detail is None or e[1] == detail))


# -- the child's draws (kernels.check.InputCache), in this process ------------------------------
def test_a_cached_check_draws_once_and_still_poisons_outputs():
    probe.EVENTS.clear()
    cache = InputCache()
    for _ in range(3):
        res = check_config(probe.KERNEL, {"n": 40}, OK, seed=1, cache=cache)
        assert res.ok, res.detail
    assert _count(probe.EVENTS, "make_inputs") == 2  # benchmark seed 1, realistic seed 2
    assert _count(probe.EVENTS, "reference") == 2
    # Outputs are fresh NaN each call: a config that writes nothing fails on a cached draw.
    res = check_config(probe.KERNEL, {"n": 40}, {"MODE": "unwritten", "BLOCK": 16}, seed=1,
                       cache=cache)
    assert not res.ok and "NaN" in res.detail
    assert _count(probe.EVENTS, "make_inputs") == 2


def test_a_config_that_modifies_its_inputs_fails_and_its_draws_are_dropped():
    probe.EVENTS.clear()
    cache = InputCache()
    assert check_config(probe.KERNEL, {"n": 40}, OK, seed=1, cache=cache).ok
    res = check_config(probe.KERNEL, {"n": 40}, {"MODE": "modify", "BLOCK": 16}, seed=1, cache=cache)
    assert not res.ok and "input x was modified" in res.detail
    # The next config gets a new, untouched draw and passes.
    before = _count(probe.EVENTS, "make_inputs")
    assert check_config(probe.KERNEL, {"n": 40}, OK, seed=1, cache=cache).ok
    assert _count(probe.EVENTS, "make_inputs") == before + 2


def test_the_cache_keeps_one_case_and_verify_drops_modified_draws():
    cache = InputCache()
    dev = probe.default_device()
    a = cache.get(probe.KERNEL, {"n": 8}, 0, "benchmark", dev)
    assert cache.get(probe.KERNEL, {"n": 8}, 0, "benchmark", dev) is a
    cache.get(probe.KERNEL, {"n": 8}, 1, "realistic", dev)
    assert len(cache) == 2
    cache.get(probe.KERNEL, {"n": 16}, 0, "benchmark", dev)
    assert len(cache) == 1  # another case: the previous one is forgotten
    assert cache.verify()
    b = cache.get(probe.KERNEL, {"n": 16}, 0, "benchmark", dev)
    b.inputs[0][0] += 1.0
    assert not cache.verify() and len(cache) == 0
    assert cache.get(probe.KERNEL, {"n": 16}, 0, "benchmark", dev) is not b


def test_the_pool_draws_shapes_once_per_case_and_keeps_two_cases():
    probe.EVENTS.clear()
    runner_mod._SHAPED.clear()
    for block in (16, 32, 64):
        runner_mod.compile_config(PROBE, {"n": 24}, {"MODE": "ok", "BLOCK": block})
    assert _count(probe.EVENTS, "make_inputs") == 1
    assert _count(probe.EVENTS, "launch") == 3
    for n in (25, 26, 24):
        runner_mod.compile_config(PROBE, {"n": n}, OK)
    assert len(runner_mod._SHAPED) == 2
    assert _count(probe.EVENTS, "make_inputs") == 4  # n=24 was dropped for 25 and 26


# -- the trial child and the pool, as processes ------------------------------------------------
def test_the_child_draws_a_case_once_and_redraws_after_a_modifying_config(probe_log):
    with TrialRunner(trial_timeout_s=30, kernel_modules=["ks_probe_kernels"]) as r:
        r.start()
        for block in (16, 32, 64):
            assert r.run(PROBE, {"n": 40}, {"MODE": "ok", "BLOCK": block}, measure_n=2).ok
        child = [e for e in probe.read_log(probe_log) if e[0] == r.pid]
        draws = [d for _, name, d in child if name == "make_inputs"]
        assert sorted(draws) == ["n=40 seed=0 benchmark", "n=40 seed=1 benchmark",
                                 "n=40 seed=2 realistic"]
        assert sum(1 for _, name, _ in child if name == "reference") == 2
        out = r.run(PROBE, {"n": 40}, {"MODE": "modify", "BLOCK": 16}, measure_n=2)
        assert out.failure_kind == "wrong_result" and "modified" in out.message
        seen = len(probe.read_log(probe_log))
        assert r.run(PROBE, {"n": 40}, OK, measure_n=2).ok
        after = [d for pid, name, d in probe.read_log(probe_log)[seen:]
                 if pid == r.pid and name == "make_inputs"]
        assert sorted(after) == sorted(draws)  # all three drawn again, untouched


class _CpuPoolRunner(TrialRunner):
    compile_under_interpreter = True


def test_the_pool_starts_with_the_runner_and_compiles_what_is_prefetched(probe_log):
    with _CpuPoolRunner(trial_timeout_s=60, kernel_modules=["ks_probe_kernels"],
                        compile_workers=2) as r:
        r.start()
        assert r.compile_pool_started and len(r._pool._processes) == 2
        configs = [{"MODE": "ok", "BLOCK": b} for b in (16, 32, 64)]
        assert r.prefetch(PROBE, {"n": 24}, configs) == 3
        assert r.prefetch(PROBE, {"n": 24}, configs[:1]) == 0  # already queued
        want = {f"n=24 MODE=ok BLOCK={b}" for b in (16, 32, 64)}
        deadline = time.monotonic() + 120
        while True:  # the pool compiles them on its own (a trial would take a queued one back)
            pool = [e for e in probe.read_log(probe_log) if e[0] != r.pid]
            if {d for _, name, d in pool if name == "launch"} == want:
                break
            assert time.monotonic() < deadline, pool
            time.sleep(0.1)
        outs = [r.run(PROBE, {"n": 24}, c, measure_n=2) for c in configs]
        assert all(o.ok for o in outs)
        # One draw per pool process for the case's shapes, not one per config.
        assert sum(1 for _, name, _ in pool if name == "make_inputs") <= 2


def test_a_trial_neither_waits_for_nor_is_timed_during_the_pools_start(monkeypatch):
    """On the H200 the first trial of a fresh runner failed: its config, handed to the pool's call
    queue behind the warm-ups (uncancellable), was waited for while 15 workers started, then
    the trial ran beside them on its own clock. Here the pool takes 15 s to start, and a slow
    config sleeps 1 s in each of its launches (about 6 s a trial) against a 3 s limit: room for
    the first config's cold compile on a GPU host, where a 0.5 s limit was too little."""
    monkeypatch.setenv(ks_fake_kernels.SLOW_POOL_ENV, "15")
    with _CpuPoolRunner(trial_timeout_s=3, kernel_modules=["ks_fake_kernels"],
                        compile_workers=1) as r:
        r.start()
        ok, slow = {"MODE": "ok", "BLOCK": 16}, {"MODE": "slow", "BLOCK": 16}
        assert r.prefetch(FAKE, {"n": 8}, [ok, slow]) == 2
        first = r.run(FAKE, {"n": 8}, ok, measure_n=2)
        assert first.ok and first.compile_wait_s == 0.0, first
        # A config that sleeps 1 s per launch is over the 3 s limit, but the clock stops while
        # the pool starts: it is not a timeout.
        assert r._pool_warming()
        out = r.run(FAKE, {"n": 8}, slow, measure_n=2)
        assert out.ok and out.compile_wait_s == 0.0, out
        deadline = time.monotonic() + 120
        while r._pool_warming():
            assert time.monotonic() < deadline, "the pool never finished starting"
            time.sleep(0.1)
        # Once the pool is up, the same sleep is a timeout again.
        late = r.run(FAKE, {"n": 8}, {"MODE": "slow", "BLOCK": 32}, measure_n=2)
        assert late.failure_kind == "timeout", late


def test_a_crash_in_the_pool_restarts_it_and_the_trial_is_typed(probe_log):
    with _CpuPoolRunner(trial_timeout_s=60, kernel_modules=["ks_probe_kernels"],
                        compile_workers=1) as r:
        r.start()
        crash = {"MODE": "crash", "BLOCK": 16}
        assert r.prefetch(PROBE, {"n": 24}, [crash]) == 1
        assert r.run(PROBE, {"n": 24}, crash, measure_n=2).failure_kind == "crash"
        assert r.prefetch(PROBE, {"n": 24}, [OK]) == 1
        assert r.compile_pool_started
        assert r.run(PROBE, {"n": 24}, OK, measure_n=2).ok


# -- the tuner's look-ahead, with a runner that answers at once --------------------------------
def probe_space(pads: int = 10) -> SearchSpace:
    return SearchSpace.from_dict({
        "kernel": PROBE,
        "param": [{"name": "MODE", "choices": ["ok"]},
                  {"name": "BLOCK", "choices": [16, 32, 64], "ordinal": True},
                  {"name": "PAD", "choices": list(range(pads)), "ordinal": True}],
    }, probe.KERNEL)


class _InstantRunner:
    """A GPU-like runner whose trials take no time: it records what was prefetched and run, and
    how many trials of the study were asked and not yet told when each trial started."""

    device_info = {"name": "test gpu", "interpreter": False}
    device_name = "test gpu"
    versions = {"torch": "t", "triton": "t"}

    def __init__(self, storage: Any, study: str, workers: int = 8):
        self.compile_workers = workers
        self.storage, self.study = storage, study
        self.events: list[tuple[str, str, str]] = []  # (prefetch|run, axes, config)
        self.in_flight: list[int] = []

    def start(self) -> None:
        return None

    def close(self) -> None:
        return None

    def copy_bandwidth(self) -> None:
        return None

    def prefetch(self, kernel: str, axes: Mapping[str, int], configs) -> int:
        for c in configs:
            self.events.append(("prefetch", json.dumps(dict(axes)), json.dumps(dict(c), sort_keys=True)))
        return len(configs)

    def run(self, kernel: str, axes: Mapping[str, int], config: Mapping[str, Any], **kw: Any) -> TrialOutcome:
        sid = self.storage.get_study_id_from_name(self.study)
        running = self.storage.get_all_trials(sid, deepcopy=False, states=(TrialState.RUNNING,))
        self.in_flight.append(len(running))
        self.events.append(("run", json.dumps(dict(axes)), json.dumps(dict(config), sort_keys=True)))
        value = 10.0 + config["BLOCK"] / 16 + config["PAD"]
        return TrialOutcome(ok=True, timing={"median_us": value, "method": "test"})


def _tune(store, runner, n_trials, name, should_stop=None, **kw):
    return tune_case(PROBE, {"n": 60}, store=store, runner=runner,
                     space=probe_space(), storage=runner.storage,
                     options=TuneOptions(n_trials=n_trials, sampler="tpe", seed=0, name=name,
                                         write_record=False, **kw),
                     hooks=TuneHooks(should_stop=should_stop))


def test_the_next_trials_are_asked_and_prefetched_while_the_current_ones_run(ss_store):
    store, _ = ss_store
    r = _InstantRunner(optuna.storages.InMemoryStorage(), "ahead")
    res = _tune(store, r, 24, "ahead")
    assert res.trials.n_run_now == 24
    runs = [i for i, e in enumerate(r.events) if e[0] == "run"]
    prefetched_at = {}
    for i, e in enumerate(r.events):
        if e[0] == "prefetch":
            prefetched_at.setdefault(e[2], i)
    # Every config was on its way to the pool before the trial before it started (but in the
    # last few, where the hand holds only the budget left and a repeated config may empty it).
    late = [k for k, i in enumerate(runs[1:], 1) if prefetched_at[r.events[i][2]] > runs[k - 1]]
    assert all(k >= 24 - 8 for k in late)
    # 8 asked and not told (never more: TPE still learns) whenever a trial starts, but in the
    # last ones, where the hand holds only the budget left.
    assert max(r.in_flight) == 8
    assert r.in_flight[:24 - 8 + 1] == [8] * (24 - 8 + 1)


def test_trials_asked_ahead_but_not_run_are_requeued_and_run_on_resume(ss_store):
    store, _ = ss_store
    storage = optuna.storages.InMemoryStorage()
    r = _InstantRunner(storage, "stop")
    res = _tune(store, r, 20, "stop", should_stop=lambda: len(r.in_flight) >= 5)
    assert res.stopped_because == "cancelled" and res.trials.n_run_now == 5
    study = optuna.load_study(study_name="stop", storage=storage)
    failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert failed and len(waiting) == len(failed)
    assert sorted(json.dumps(t.params, sort_keys=True) for t in failed) == \
        sorted(json.dumps(t.system_attrs["fixed_params"], sort_keys=True) for t in waiting)
    r2 = _InstantRunner(storage, "stop")
    res2 = _tune(store, r2, 5 + len(waiting), "stop", warm_start=False)
    assert res2.trials.n_run_now == len(waiting)
    assert not study.get_trials(deepcopy=False, states=(TrialState.WAITING,))


def test_the_next_cases_warm_start_is_prefetched_before_this_case_ends(ss_store):
    store, _ = ss_store
    r = _InstantRunner(optuna.storages.InMemoryStorage(), "this")
    res = _tune(store, r, 12, "this", next_case=(PROBE, {"n": 64}))
    nxt = [(i, json.loads(e[2])) for i, e in enumerate(r.events)
           if e[0] == "prefetch" and json.loads(e[1]) == {"n": 64}]
    last_run = max(i for i, e in enumerate(r.events) if e[0] == "run")
    assert nxt and max(i for i, _ in nxt) < last_run
    configs = [c for _, c in nxt]
    assert probe.KERNEL.default_config in configs
    # This case's best so far: the next case's nearest neighbour once its record is written.
    best_then = min((json.loads(e[2]) for e in r.events[:nxt[0][0]] if e[0] == "run"),
                    key=lambda c: c["BLOCK"] / 16 + c["PAD"])
    assert best_then in configs
    assert res.stopped_because == "n_trials"


def test_a_next_case_that_cannot_be_prefetched_does_not_fail_this_one(ss_store, caplog):
    store, _ = ss_store
    r = _InstantRunner(optuna.storages.InMemoryStorage(), "hint")
    with caplog.at_level(logging.WARNING, logger="kernelsearch.search_space.study_loop"):
        # The test kernel has no packaged space: the look-ahead fails, the case does not.
        res = _tune(store, r, 6, "hint", next_case=(FAKE, {"n": 8}))
    assert res.stopped_because == "n_trials" and res.trials.n_run_now == 6
    assert "prefetch of the next case" in caplog.text
    assert all(json.loads(e[1]) == {"n": 60} for e in r.events)


def test_without_a_pool_nothing_is_asked_ahead(ss_store):
    store, _ = ss_store
    r = _InstantRunner(optuna.storages.InMemoryStorage(), "none", workers=0)
    res = _tune(store, r, 6, "none", next_case=(PROBE, {"n": 64}))
    assert res.trials.n_run_now == 6
    assert not [e for e in r.events if e[0] == "prefetch"]
    assert max(r.in_flight) == 1
