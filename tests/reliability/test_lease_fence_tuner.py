"""Fenced leases in the tuner, in process on SQLite with a scripted runner (no trial children):
a worker that lost its lease (another took its job and study over while it hung) writes nothing
more to the study: not its trial's tell, not the cleanup of RUNNING trials, which would fail the
new holder's trial in flight (issue 24.0). And a trial someone else failed while it ran costs
that trial, never the case."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from kernelsearch.db.engine import upgrade
from kernelsearch.db.errors import LeaseLost
from kernelsearch.db.interfaces import Lease
from kernelsearch.db.store import Store
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.search_space.runner import TrialOutcome
from kernelsearch.search_space.space import SearchSpace, get_space
from kernelsearch.search_space.tuner import A_RUN, TuneHooks, TuneOptions, study_name, tune_case

KERNEL = "vision_rope_generation_bwd"
AXES = {"total_patches": 2}
STUDY = study_name(KERNEL, AXES, INTERPRETER_DEVICE)


class ScriptedRunner:
    """Answers every trial at once with a measured latency, calling `during(n)` while the n-th
    trial "runs" (where a test makes another worker act)."""

    compile_workers = 0
    device_name = INTERPRETER_DEVICE
    device_info = {"name": INTERPRETER_DEVICE, "interpreter": True}
    versions = {"torch": "test", "triton": "test"}

    def __init__(self, during: Callable[[int], None] | None = None) -> None:
        self.calls, self.during = 0, during

    def run(self, *args: Any, **kwargs: Any) -> TrialOutcome:
        self.calls += 1
        if self.during is not None:
            self.during(self.calls)
        us = 10.0 + self.calls
        return TrialOutcome(ok=True, timing={"median_us": us, "min_us": us, "max_us": us,
                                             "iqr_us": 0.0, "method": "interpreter-wallclock"},
                            rel_errors={"grad": 0.0})

    def prefetch(self, *args: Any, **kwargs: Any) -> int:
        return 0


@pytest.fixture
def store(sqlite_url: str):
    upgrade(sqlite_url)
    with Store(sqlite_url) as s:
        yield s


def _options(lease: Lease, n_trials: int = 3) -> TuneOptions:
    return TuneOptions(n_trials=n_trials, sampler="random", warm_start=False, measure_n=1,
                       reference="none", write_record=False, exclusive=True, lease=lease,
                       job_id=lease.job_id, run_tag=f"job:{lease.job_id}")


@functools.cache
def _space() -> SearchSpace:
    """The space file's reduced subset: the tuner enumerates its space's whole grid (A's full
    one took most of this file's time); what is fenced does not depend on the space."""
    return get_space(KERNEL).reduced()


def _tune(store: Store, lease: Lease, runner: ScriptedRunner, n_trials: int = 3,
          hooks: TuneHooks = TuneHooks()) -> Any:
    return tune_case(KERNEL, AXES, store=store.under_lease(lease), storage=store.url,
                     runner=runner, options=_options(lease, n_trials), hooks=hooks,  # type: ignore[arg-type]
                     space=_space())


def _claimed(store: Store, owner: str, lease_seconds: float = 60) -> Lease:
    lease = Lease.of(store.claim_job(owner, lease_seconds))
    assert store.claim_study(STUDY, lease, lease_seconds) is None
    return lease


def _take_over(store: Store) -> tuple[Lease, optuna.Study, optuna.trial.Trial]:
    """Worker B takes the job and its study over (A's lease lapsed) and starts a trial."""
    b = _claimed(store, "B", lease_seconds=1e-6)
    study = optuna.load_study(study_name=STUDY, storage=store.url)
    return b, study, study.ask()


def _trials(store: Store, state: TrialState) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=STUDY, storage=store.url).get_trials(states=(state,))


def test_stale_cleanup_leaves_the_new_holders_trial_alone(store: Store) -> None:
    """A's heartbeat finds the lease lost after its first trial, so its loop stops and its
    cleanup of RUNNING trials runs while B's trial is in flight: refused, B's tell succeeds."""
    store.create_job(KERNEL, [AXES], 3, "random")
    a = _claimed(store, "A")
    taken: list[Any] = []

    def progress(done: int, total: int, best: float | None) -> None:
        if not taken:
            taken.extend(_take_over(store))

    with pytest.raises(LeaseLost, match="held by B"):
        _tune(store, a, ScriptedRunner(), hooks=TuneHooks(progress=progress,
                                                           should_stop=lambda: bool(taken)))
    b, study_b, trial_b = taken
    assert [t.number for t in _trials(store, TrialState.RUNNING)] == [trial_b.number]
    study_b.tell(trial_b, 1.0)  # B's trial ends as B ran it
    done = _trials(store, TrialState.COMPLETE)
    assert trial_b.number in [t.number for t in done]
    assert len([t for t in done if t.user_attrs.get(A_RUN)]) == 1, "A's first trial"


def test_stale_tell_is_refused_and_the_new_holder_counts_each_trial_once(store: Store) -> None:
    """B takes over while A's second trial runs: A's tell of it is refused (and nothing after
    it is written); B fails it as left RUNNING, tunes on, and the job's study ends with exactly
    its trials."""
    store.create_job(KERNEL, [AXES], 3, "random")
    a = _claimed(store, "A")
    taken: list[Any] = []

    def during(n: int) -> None:
        if n == 2:
            taken.extend(_take_over(store))
            taken[1].tell(taken[2], state=TrialState.FAIL)  # B's first ask is not needed here

    with pytest.raises(LeaseLost):
        _tune(store, a, ScriptedRunner(during))
    assert len([t for t in _trials(store, TrialState.COMPLETE) if t.user_attrs.get(A_RUN)]) == 1
    assert len(_trials(store, TrialState.RUNNING)) == 1, "A's second trial, never told"

    b = taken[0]
    res = _tune(store, b, ScriptedRunner())
    assert res.trials.n_counted == 3 and res.stopped_because == "n_trials"
    evaluated = [t for t in _trials(store, TrialState.COMPLETE) if t.user_attrs.get(A_RUN)]
    assert len(evaluated) == 3 and not _trials(store, TrialState.RUNNING)
    rows = store.trial_summaries(KERNEL, INTERPRETER_DEVICE, AXES)
    assert sorted(r["trial_number"] for r in rows) == sorted(t.number for t in evaluated)
    store.finish_job(b, "succeeded")


def test_a_trial_failed_by_someone_else_costs_that_trial_not_the_case(store: Store) -> None:
    """While B's second trial runs, a worker with no fence (an older version, the dashboard)
    fails it: B's tell raises UpdateFinishedTrialError, which drops that trial's outcome and
    goes on; the case still ends with its n_trials evaluated."""
    store.create_job(KERNEL, [AXES], 3, "random")
    b = _claimed(store, "B")

    def during(n: int) -> None:
        if n == 2:
            storage = optuna.storages.RDBStorage(store.url)
            for t in _trials(store, TrialState.RUNNING):
                storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)

    runner = ScriptedRunner(during)
    res = _tune(store, b, runner)
    assert runner.calls == 4 and res.trials.n_counted == 3 and res.stopped_because == "n_trials"
    evaluated = [t for t in _trials(store, TrialState.COMPLETE) if t.user_attrs.get(A_RUN)]
    assert len(evaluated) == 3
