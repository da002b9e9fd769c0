"""The tuner: one Optuna study per (kernel, case, device) in the project's database.

Each asked config is checked against the space (constraints, then the kernel's validation)
before anything runs; the runner then validates, compiles, checks and measures it in a child
process. The objective is the median latency. Because TPE (and Optuna's other model-based
samplers) never learn from FAIL trials, a config that is rejected or fails at run time is told
to Optuna as a COMPLETE trial with a violated constraint (`trial.set_constraint`) and a penalty
value: TPE and GP then steer away from it, GridSampler counts it as visited. The trial's user
attributes and the store's trial summary still say it failed and why (state "fail",
failure_kind). Every config that ran is remembered per study, so a repeated proposal is answered
from the stored outcome instantly and never re-run.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import random
import re
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.storages import BaseStorage, fail_stale_trials
from optuna.trial import TrialState

from kernelsearch.db.checks import bounded_name
from kernelsearch.db.errors import LeaseLost
from kernelsearch.db.interfaces import Lease, RecordRepository, TuningStore
from kernelsearch.db.optuna_storage import RetryingStorage, open_optuna_storage
from kernelsearch.db.statuses import TrialStatus
from kernelsearch.kernels import get_kernel
from kernelsearch.kernels.undeclared import UndeclaredKernel
from kernelsearch.kernels.measure import default_repeats
from kernelsearch.kernels.configs import canonical_key
from kernelsearch.kernels.spec import config_key

from .compiled import store_compiled
from .records import REFERENCES, BestTrial, best_record
from .runner import TrialCancelled, TrialOutcome, TrialRunner
from .space import SearchSpace, case_space, get_space
from .heartbeat import Heartbeat
from .states import StopReason, TrialMark
from .warm_start import enqueue_warm_start, warm_start_configs, warm_start_picks

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random", "grid", "gp", "cmaes")
CONSTRAINT = "ks_failure"
# Attributes the tuner keeps on each Optuna trial (user_attrs).
A_CONFIG, A_STATE, A_KIND, A_MSG, A_OUT, A_RUN, A_TAG = (
    "ks_config", "ks_state", "ks_failure_kind", "ks_message", "ks_outcome", "ks_evaluated",
    "ks_run_tag")
# The one parameter of an older grid study (an index into the space's grid); read, never written.
GRID_PARAM = "grid_id"


@dataclass(frozen=True)
class CaseKey:
    """Which case was tuned, and in which study with which sampler."""

    kernel: str
    axes: dict[str, int]
    device: str
    study_name: str
    sampler: str


@dataclass(frozen=True)
class BestFound:
    """The study's best config so far, and what became of the case's record."""

    config: dict[str, Any] | None = None
    latency_us: float | None = None
    timing_method: str | None = None
    improved: bool = False
    record_id: int | None = None


@dataclass(frozen=True)
class TrialCounts:
    """How many trials, and which: this call's and the study's."""

    n_complete: int = 0
    n_failed: int = 0
    n_rejected: int = 0
    n_cached: int = 0
    n_run_now: int = 0
    # Evaluated trials that count toward n_trials (the run tag's, or the whole study's).
    n_counted: int = 0
    warm_started: int = 0
    # Latency (None for a failure) of every evaluated trial of the study, in trial order.
    history: list[float | None] = field(default_factory=list)


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds spent per phase over this call's trials, and the call's wall time."""

    compile_s: float = 0.0
    check_s: float = 0.0
    measure_s: float = 0.0
    compile_wait_s: float = 0.0
    wall_s: float = 0.0


@dataclass(frozen=True)
class Failures:
    """Failure kind -> count over this call's trials (`new_kinds`) and the whole study's
    (`kinds`); the first message of each (this call's when it has failures, else the study's)."""

    new_kinds: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    first: str | None = None


@dataclass(frozen=True)
class CaseResult:
    """What tuning one case produced; phase seconds count this call's trials only."""

    key: CaseKey
    stopped_because: StopReason
    best: BestFound = field(default_factory=BestFound)
    trials: TrialCounts = field(default_factory=TrialCounts)
    times: PhaseTimes = field(default_factory=PhaseTimes)
    failures: Failures = field(default_factory=Failures)

    def as_dict(self) -> dict[str, Any]:
        """The flat document the CLI writes (`tune --json`) and a job's reader expects: these
        keys in this order, whatever the grouping above."""
        k, b, n, t, f = self.key, self.best, self.trials, self.times, self.failures
        return copy.deepcopy({
            "kernel": k.kernel, "axes": k.axes, "device": k.device, "study_name": k.study_name,
            "sampler": k.sampler, "best_config": b.config, "best_latency_us": b.latency_us,
            "n_complete": n.n_complete, "n_failed": n.n_failed, "improved": b.improved,
            "compile_s": t.compile_s, "check_s": t.check_s, "measure_s": t.measure_s,
            "stopped_because": self.stopped_because, "n_rejected": n.n_rejected,
            "n_cached": n.n_cached, "n_run_now": n.n_run_now, "wall_s": t.wall_s,
            "compile_wait_s": t.compile_wait_s, "warm_started": n.warm_started,
            "timing_method": b.timing_method, "record_id": b.record_id, "history": n.history,
            "n_counted": n.n_counted, "new_failure_kinds": f.new_kinds,
            "failure_kinds": f.kinds, "first_failure": f.first,
        })

    def failure_summary(self) -> str:
        """Why trials failed, for a person: kinds with counts and the first message."""
        kinds = self.failures.new_kinds or self.failures.kinds
        if not kinds:
            why = {StopReason.SPACE_EXHAUSTED: "every config of the space was already tried",
                   StopReason.SAMPLER_STUCK: "the sampler only proposed rejected or known configs",
                   StopReason.N_TRIALS: "no trial was left to run"}.get(self.stopped_because,
                                                                         self.stopped_because)
            return f"no config was measured: {why}"
        scope = "this run's" if self.failures.new_kinds else "the study's"
        n = sum(kinds.values())
        parts = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        text = f"{n} of {scope} trials failed ({parts})"
        return f"{text}; first: {self.failures.first}" if self.failures.first else text


class TuneError(ValueError):
    """Bad arguments to the tuner (unknown sampler, bad counts), naming the argument."""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_")


def study_name(kernel: str, axes: Mapping[str, int], device: str) -> str:
    """The study's name, derived only from the key: the same case on the same device resumes."""
    ax = ",".join(f"{k}={v if isinstance(v, str) else int(v)}" for k, v in sorted(axes.items()))
    # A long kernel name (a deep package path) still names a study its columns can hold.
    return bounded_name(f"ks/{kernel}/{ax}/{_slug(device)}", STUDY_NAME_CHARS)


# The width of a study's name in the store (ks_trials, ks_study_claims, a record's study_name).
STUDY_NAME_CHARS = 300


# The objective's name in the study (optuna-dashboard's axis label instead of "Objective 0").
METRIC_NAME = "latency_us"
# Trial system attribute holding the grid point a `_ConfigGridSampler` assigned to a trial.
GRID_ATTR = "ks_grid_point"


class _ConfigGridSampler(optuna.samplers.BaseSampler):
    """Every config of the space's grid once, each trial's parameters the config's own fields.

    Optuna's GridSampler wants a Cartesian product, while a space's grid is filtered by its
    constraints and conditional parameters; a single `grid_id` index parameter made the
    dashboard unreadable. Here each trial is given a grid point (a config) before it runs and
    answers every `suggest_categorical` from it. Points count as visited from a finished trial's
    parameters (enqueued ones included) and a running trial's assigned point; an older study's
    `grid_id` parameter is read as the index into the same grid. Stopping is the loop's."""

    def __init__(self, points: Sequence[Mapping[str, Any]], seed: int | None = None):
        self._points = [dict(p) for p in points]
        self._index = {self._key(p): i for i, p in enumerate(self._points)}
        self._order = list(range(len(self._points)))
        random.Random(seed or 0).shuffle(self._order)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)

    @staticmethod
    def _key(params: Mapping[str, Any]) -> str:
        return json.dumps(sorted(params.items()), default=str)

    def _visited(self, study: optuna.Study) -> tuple[set[int], set[int]]:
        done, running = set(), set()
        for t in study._storage.get_all_trials(study._study_id, deepcopy=False):
            if t.state == TrialState.RUNNING:
                if GRID_ATTR in t.system_attrs:
                    running.add(int(t.system_attrs[GRID_ATTR]))
                continue
            if not t.state.is_finished():
                continue
            if GRID_PARAM in t.params:
                done.add(int(t.params[GRID_PARAM]))
            elif self._key(t.params) in self._index:
                done.add(self._index[self._key(t.params)])
        return done, running

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if GRID_ATTR in trial.system_attrs or "fixed_params" in trial.system_attrs:
            return
        done, running = self._visited(study)
        free = [i for i in self._order if i not in done and i not in running]
        free = free or [i for i in self._order if i not in done] or self._order
        if free:
            study._storage.set_trial_system_attr(trial._trial_id, GRID_ATTR, free[0])

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                           param_name: str, param_distribution: Any) -> Any:
        point = trial.system_attrs.get(GRID_ATTR)
        fixed = trial.system_attrs.get("fixed_params") or {}
        if point is None and GRID_PARAM in fixed:  # re-queued by an older version of the loop
            point = fixed[GRID_PARAM]
        if point is not None and 0 <= int(point) < len(self._points) and param_name in self._points[int(point)]:
            return self._points[int(point)][param_name]
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def make_sampler(name: str, space: SearchSpace, *, seed: int | None = None,
                 n_startup_trials: int = 10) -> optuna.samplers.BaseSampler:
    """The sampler for a study; passed on every load, since load_study would use a default."""
    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials,
                                          multivariate=True, group=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return _ConfigGridSampler([{p.optuna_name: c[p.name] for p in space.params if p.name in c}
                                   for c in space.grid()], seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials,
                                         warn_independent_sampling=False)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=n_startup_trials,
                                            warn_independent_sampling=False)
    raise TuneError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {name!r}")


def _with_versions(runner: Any) -> dict[str, Any]:
    """The runner's device info with the torch and triton versions its child reported, which
    the dashboard compares records with."""
    from kernelsearch.db.views import WORKER_VERSIONS

    info = dict(runner.device_info)
    reported = getattr(runner, "versions", None) or {}
    if reported:
        info[WORKER_VERSIONS] = {k: reported.get(k) for k in ("torch", "triton")}
    return info


def make_storage(url: str, *, heartbeat_s: int = 10, grace_s: int | None = None,
                 retry_s: float = 30.0) -> RetryingStorage:
    """Optuna's RDB storage with heartbeats, so a dead worker's RUNNING trial is failed and
    retried; with the store's engine options (pre-ping, keepalives, connect timeout), and each
    call retried on a transient failure for up to `retry_s` seconds (db.optuna_storage)."""
    return open_optuna_storage(url, heartbeat_s=heartbeat_s, grace_s=grace_s, retry_s=retry_s)


RetryingRDBStorage = RetryingStorage  # the tuner's exported name for it


def prefetch_case(runner: Any, store: RecordRepository, kernel: str, axes: Mapping[str, int], device: str, *,
                  space: SearchSpace | None = None,
                  also: Sequence[Mapping[str, Any]] = ()) -> int:
    """Queue a case's warm-start configs (`warm_start_picks` and `also`)
    on the runner's compile-ahead pool before the case starts; returns how many were queued.
    Only a hint: a config missing from the pool is compiled by the trial itself."""
    if not runner.compile_workers:
        return 0
    space = space or case_space(kernel, axes, get_space)
    axes = get_kernel(kernel).validate_axes(axes)
    configs = [dict(c) for c in also]
    configs += [c for c, _ in warm_start_picks(store, kernel, axes, device, space)]
    # Each is valid already (a run trial, or checked against the space): canonical, once each.
    fresh = {space.key(c): space.canonical(c) for c in configs}
    return runner.prefetch(kernel, axes, list(fresh.values()))


def _state_of(t: optuna.trial.FrozenTrial) -> TrialMark | None:
    """The tuner's mark on a trial; None for a trial without one (or with one it does not know)."""
    st = t.user_attrs.get(A_STATE)
    try:
        return None if st is None else TrialMark(st)
    except ValueError:
        return None


@dataclass(frozen=True)
class TuneOptions:
    """How one case is tuned; checked when built (TuneError names the bad field).

    Stopping: `n_trials` evaluated configs, `timeout_s`, `patience` evaluated trials without
    improvement, `max_rejected` rejected proposals in a row. What counts toward `n_trials`:
    without `run_tag`, every evaluated trial of the study (a resumed study counts its stored
    trials); with it, only the evaluated trials carrying that tag, so a run adds `n_trials` to the
    study, and a run resumed with the same tag (a job claimed again) counts its own trials once.
    Failed trials count: a failure is an evaluated config.

    `measure_n` None: the device's `default_repeats`. `name` overrides the study name
    (experiments). `reference` ("none", "eager", "both", "auto": both on a GPU, eager otherwise)
    measures the PyTorch references once for the record's speedups (a record that ships without
    them has none to show); `copy_bandwidth` (bytes/s) gives the roofline (measured on a GPU when
    not given). `summaries=False` skips the store's per-trial summaries. `next_case` (kernel,
    axes) is the case tuned after this one: once half of this case's budget is spent, its
    warm-start configs go to the compile-ahead pool, so its first trials find them compiled.
    `exclusive`: the caller holds the study's claim (no one else tunes it now), so trials left
    RUNNING by a dead worker, an outage or a failed job are failed before and after.
    `lease`: the job lease the study's claim was taken under (a worker's job). Every write to
    the study (asks, attributes, tells, the cleanup of RUNNING trials) then checks, in its own
    transaction, that the claim is still held under it, and LeaseLost ends the case at once
    when it is not: a worker that lost its lease never touches the new holder's trials.
    """

    n_trials: int
    sampler: str = "tpe"
    timeout_s: float | None = None
    patience: int | None = None
    max_rejected: int | None = None
    warm_start: bool = True
    seed: int | None = None
    measure_n: int | None = None
    name: str | None = None
    heartbeat_s: int = 10
    reference: str = "auto"
    copy_bandwidth: float | None = None
    write_record: bool = True
    summaries: bool = True
    next_case: tuple[str, Mapping[str, int]] | None = None
    run_tag: str | None = None
    job_id: int | None = None
    exclusive: bool = False
    lease: Lease | None = None

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise TuneError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        n = self.n_trials
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TuneError(f"n_trials: expected an int >= 0, got {n!r}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise TuneError(f"timeout_s: must be positive, got {self.timeout_s!r}")
        if self.patience is not None and self.patience < 1:
            raise TuneError(f"patience: must be >= 1, got {self.patience!r}")
        if self.measure_n is not None and self.measure_n < 1:
            raise TuneError(f"measure_n: must be >= 1, got {self.measure_n!r}")
        if self.reference not in REFERENCES:
            raise TuneError(f"reference: expected one of {', '.join(REFERENCES)}, got {self.reference!r}")


@dataclass(frozen=True)
class TuneHooks:
    """The caller's side of a running case. `progress(done, n_trials, best_us)` after every
    evaluated trial; `should_stop()` between trials ends the case; `cancel()`, asked while a
    trial runs, stops that trial at once (its child killed) and the case with "cancelled"."""

    progress: Callable[[int, int, float | None], None] | None = None
    should_stop: Callable[[], bool] | None = None
    cancel: Callable[[], bool] | None = None


def tune_case(kernel: str, axes: Mapping[str, int], *, store: TuningStore,
              storage: str | BaseStorage, options: TuneOptions, runner: TrialRunner | None = None,
              space: SearchSpace | None = None, hooks: TuneHooks = TuneHooks()) -> CaseResult:
    """Tune one case until `options` say stop, then write or improve the case's best record.

    `storage` is where the study is kept: a database URL (`make_storage` opens it), or an open
    Optuna storage (experiments replaying a table in memory, or one storage shared by the cases
    of a run). `runner` runs the trials (one of its own, closed after, when None); `space`
    overrides the packaged space.
    """
    t_wall = time.monotonic()
    o = options
    kdef = get_kernel(kernel)
    try:
        axes = kdef.validate_axes(axes)
    except ValueError as exc:
        raise TuneError(f"axes: {exc}") from None
    space = space or case_space(kernel, axes, get_space)
    if space.kernel.name != kernel:
        raise TuneError(f"space: written for {space.kernel.name!r}, not {kernel!r}")
    grid = space.grid()
    if not grid:
        raise TuneError(f"space of {kernel}: no config passes its constraints")
    own_runner = runner is None
    runner = runner or TrialRunner()
    fence: Callable[[], None] | None = None
    try:
        device = runner.device_name
        measure_n = o.measure_n
        if measure_n is None:
            # The child's device (known once it started), else this process's.
            info = getattr(runner, "device_info", None) or {}
            measure_n = default_repeats(info.get("interpreter"))
        store.ensure_device(_with_versions(runner))
        sname = o.name or study_name(kernel, axes, device)
        opened = make_storage(storage, heartbeat_s=o.heartbeat_s) if isinstance(storage, str) else storage
        if o.lease is not None:
            fence = _fence_storage(opened, store, sname, o.lease)
        study = optuna.create_study(study_name=sname, storage=opened, direction="minimize",
                                    sampler=optuna.samplers.RandomSampler(seed=o.seed),
                                    load_if_exists=True)
        # The sampler once the space's parameter names fit what the study already holds.
        space = space.for_study(_held_distributions(study))
        study.sampler = make_sampler(o.sampler, space, seed=o.seed)
        if study.metric_names != [METRIC_NAME]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([METRIC_NAME])
        loop = _Loop(CaseStudy(kdef.name, axes, device, space, grid, study, opened, store,
                               runner, measure_n, o, hooks))
        loop.study.set_user_attr("ks_key", {"kernel": kernel, "axes": axes, "device": device})
        loop.study.set_user_attr("ks_space", space.fingerprint)
        if o.exclusive:
            fail_running_trials(loop.study)
        if o.summaries:
            loop.repair_summaries()
        warm = loop.warm_start() if o.warm_start and o.sampler != "grid" else 0
        lost = False
        try:
            stopped = loop.run()
        except LeaseLost:
            lost = True
            raise
        finally:
            if o.exclusive and not lost:
                # The trial in hand when the loop failed too (a failing job, an outage); under a
                # lease, each fail is refused once the study's claim is someone else's.
                try:
                    fail_running_trials(loop.study)
                except LeaseLost:
                    raise
                except Exception as exc:  # the next claimer of the study fails them instead
                    log.warning("RUNNING trials of %s not failed: %s", sname, exc)
        res = loop.result(stopped, warm)
        best = loop.best_trial()
        if o.write_record and best is not None and (loop.run_now or not _has_record(
                store, kernel, axes, device)):
            rec, improved = store.upsert_best(best_record(
                best, runner, job_id=o.job_id, reference=o.reference,
                copy_bandwidth=o.copy_bandwidth, measure_n=measure_n,
                # An undeclared kernel's record says what it measured: a decorator serves it
                # only when it covers the decorator's config list.
                config_timings=loop.config_timings() if isinstance(kdef, UndeclaredKernel)
                else None))
            store_compiled(store, rec.id, best.outcome.get("compiled"))
            res = replace(res, best=replace(res.best, improved=improved, record_id=rec.id))
        return replace(res, times=replace(res.times, wall_s=time.monotonic() - t_wall))
    finally:
        if fence is not None:
            fence()
        if own_runner:
            runner.close()


def _held_distributions(study: optuna.Study) -> dict[str, Any]:
    """Each Optuna parameter name the study's trials hold, with its distribution."""
    held: dict[str, Any] = {}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            held.setdefault(name, dist)
    return held


def _fence_storage(storage: Any, store: TuningStore, study: str, lease: Lease) -> Callable[[], None]:
    """Check every write of `storage` (Optuna's RDB storage, on the store's database) against the
    study's claim under `lease`, in the write's own transaction: after each flush, so the check
    runs once the write holds its locks and both commit together. Returns the undo."""
    from sqlalchemy import event

    rdb = storage.rdb if isinstance(storage, RetryingStorage) else storage
    factory = getattr(getattr(rdb, "scoped_session", None), "session_factory", None)
    if factory is None:
        raise TuneError(f"lease: needs Optuna's RDB storage (on the store's database), not {type(storage).__name__}")

    def check(session: Any, _flush_context: Any) -> None:
        store.check_study_claim(session, study, lease)

    event.listen(factory, "after_flush", check)
    return lambda: event.remove(factory, "after_flush", check)


def _prefetch_next(loop: "_Loop", next_case: tuple[str, Mapping[str, int]]) -> int:
    """The next case's warm-start configs to the pool; of the same kernel, with this case's best
    so far, which becomes the next case's nearest neighbour once this case writes its record."""
    kernel, axes = next_case
    same = kernel == loop.kernel
    also = [loop.best[1]] if same and loop.best is not None else []
    return prefetch_case(loop.runner, loop.store, kernel, axes, loop.device,
                         space=loop.space if same else None, also=also)


def fail_running_trials(study: optuna.Study) -> int:
    """Fail every RUNNING trial of a study that nobody is tuning now (its claim is ours); returns
    how many. They were never evaluated (an evaluated trial is told before it counts), so a
    failed one costs nothing but leaves the study's state true."""
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        try:
            if study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                n += 1
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # told meanwhile
    if n:
        log.info("study %s: %d trial(s) left RUNNING failed", study.study_name, n)
    return n


def _has_record(store: RecordRepository, kernel: str, axes: Mapping[str, int], device: str) -> bool:
    return any(dict(r.axes) == dict(axes) for r in store.list_records(kernel, device))


@dataclass(frozen=True)
class CaseStudy:
    """One case's opened study and all its loop needs: the case (kernel, axes, device, the
    space fitted to the study and its grid), where it is kept (study, storage, store), what runs
    its trials (runner, measure_n) and the caller's options and hooks."""

    kernel: str
    axes: Mapping[str, int]
    device: str
    space: SearchSpace
    grid: list[dict[str, Any]]
    study: optuna.Study
    storage: BaseStorage
    store: TuningStore
    runner: TrialRunner
    measure_n: int
    options: TuneOptions
    hooks: TuneHooks


class _Loop:
    """The ask/tell loop of one study, with its memory of outcomes per config."""

    def __init__(self, case: CaseStudy):
        self.options, self.hooks = case.options, case.hooks
        self.kernel, self.axes, self.device = case.kernel, dict(case.axes), case.device
        self.space, self.grid, self.study, self.storage = case.space, case.grid, case.study, case.storage
        self.store, self.runner, self.measure_n = case.store, case.runner, case.measure_n
        self.ahead = False  # asking ahead for the compile pool; set by run()
        self.seen: dict[str, dict[str, Any]] = {}   # config key -> stored outcome (state, value)
        self.best: tuple[float, dict[str, Any], dict[str, Any]] | None = None  # value, cfg, outcome
        self.evaluated = 0
        self.counted = 0  # evaluated trials that count toward n_trials
        self.failed = 0
        self.failure_kinds: dict[str, int] = {}
        self.new_failure_kinds: dict[str, int] = {}
        self.first_failure: str | None = None
        self.first_new_failure: str | None = None
        self.rejected = 0
        self.cached = 0
        self.run_now = 0
        self.phase = {"compile": 0.0, "check": 0.0, "measure": 0.0, "wait": 0.0}
        self.history: list[float | None] = []
        self.worst_ok: float | None = None
        # Called once when half the budget is spent (the options' next_case look-ahead).
        next_case = self.options.next_case
        self.near_end: Callable[[], Any] | None = (
            None if next_case is None else lambda: _prefetch_next(self, next_case))
        self._load_existing()

    # -- state from the study --------------------------------------------------------------
    def _load_existing(self) -> None:
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        for t in sorted(trials, key=lambda t: t.number):
            st = _state_of(t)
            cfg = t.user_attrs.get(A_CONFIG)
            if st not in (TrialMark.OK, TrialMark.FAIL) or cfg is None:
                continue
            if not t.user_attrs.get(A_RUN):
                continue
            key = config_key(cfg)
            self.evaluated += 1
            if self.options.run_tag is None or t.user_attrs.get(A_TAG) == self.options.run_tag:
                self.counted += 1
            if st == TrialMark.OK and t.value is not None:
                self._remember_ok(key, t.value, cfg, t.user_attrs.get(A_OUT) or {})
                self.history.append(t.value)
            else:
                self.failed += 1
                self.seen[key] = {"state": TrialMark.FAIL, "kind": t.user_attrs.get(A_KIND),
                                  "message": t.user_attrs.get(A_MSG)}
                self._count_failure(t.user_attrs.get(A_KIND), t.user_attrs.get(A_MSG), new=False)
                self.history.append(None)
        self.best_at = self.evaluated

    def _count_failure(self, kind: str | None, message: str | None, *, new: bool) -> None:
        k = kind or "unknown"
        self.failure_kinds[k] = self.failure_kinds.get(k, 0) + 1
        self.first_failure = self.first_failure or message
        if new:
            self.new_failure_kinds[k] = self.new_failure_kinds.get(k, 0) + 1
            self.first_new_failure = self.first_new_failure or message

    def repair_summaries(self) -> int:
        """Write the trial summaries the study has and the store lacks (a worker killed between
        Optuna's tell and the summary); the study is the source of truth. Returns how many."""
        try:
            have = self.store.trial_numbers(self.study.study_name)
        except Exception as exc:  # a repair that cannot run now runs on the next resume
            log.warning("trial summaries of %s not checked: %s", self.study.study_name, exc)
            return 0
        n = 0
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            st, cfg = _state_of(t), t.user_attrs.get(A_CONFIG)
            if t.number in have or st not in (TrialMark.OK, TrialMark.FAIL) or cfg is None or not t.user_attrs.get(A_RUN):
                continue
            out = dict(t.user_attrs.get(A_OUT) or {})
            extra = {k: v for k, v in out.items() if k not in ("ok", "failure_kind", "message")}
            extra["sampler"] = self.options.sampler
            extra["repaired"] = True
            self.store.add_trial_summary(
                self.study.study_name, self.kernel, self.device, self.axes, t.number,
                TrialStatus.COMPLETE if st == TrialMark.OK else TrialStatus.FAIL, cfg,
                (out.get("timing") or {}).get("median_us", t.value) if st == TrialMark.OK else None,
                t.user_attrs.get(A_KIND), t.user_attrs.get(A_MSG) or None, extra)
            n += 1
        if n:
            log.info("study %s: %d missing trial summaries repaired", self.study.study_name, n)
        return n

    def _remember_ok(self, key: str, value: float, cfg: dict[str, Any], outcome: dict[str, Any]) -> bool:
        self.seen[key] = {"state": TrialMark.OK, "value": value}
        self.worst_ok = value if self.worst_ok is None else max(self.worst_ok, value)
        if self.best is None or value < self.best[0]:
            self.best = (value, cfg, outcome)
            return True
        return False

    def config_timings(self) -> dict[str, float | None]:
        """Every config this study evaluated, by canonical_key (a record's config timings): its
        median (us), None if it failed."""
        return {canonical_key(json.loads(k)): (v["value"] if v["state"] == "ok" else None)
                for k, v in self.seen.items()}

    def _penalty(self) -> float:
        # A finite value for samplers that read values of infeasible trials (CMA-ES, GP):
        # worse than every measured config, but on the same scale.
        return 2.0 * self.worst_ok if self.worst_ok else 1e7

    # -- warm start ------------------------------------------------------------------------
    def warm_start(self) -> int:
        return enqueue_warm_start(self.study, self.store, self.kernel, self.axes, self.device,
                                  self.space, self.seen)

    # -- the loop --------------------------------------------------------------------------
    def _config(self, trial: optuna.Trial) -> dict[str, Any]:
        return self.space.suggest(trial)

    def run(self) -> StopReason:
        """Ask, evaluate and tell until the options (or the hooks) say stop; returns why."""
        o, h = self.options, self.hooks
        n_trials, timeout_s, patience, max_rejected = o.n_trials, o.timeout_s, o.patience, o.max_rejected
        progress, should_stop = h.progress, h.should_stop
        t0 = time.monotonic()
        limit_rej = max_rejected if max_rejected is not None else max(50, 10 * n_trials)
        # Asking ahead feeds the compile pool; model-based samplers keep at most 8 asked and not
        # yet told, so they still learn from most results before proposing (TPE's constant liar
        # spreads what is in flight). With a pool, the hand is topped up after every trial, so
        # each config is asked (and sent to the pool) about `batch` trials before it runs: a
        # compile takes seconds, a trial a fraction of one.
        batch = max(1, self.runner.compile_workers or 1)
        if self.options.sampler in ("tpe", "gp", "cmaes"):
            batch = min(batch, 8)
        self.ahead = batch > 1
        interval = getattr(self.storage, "get_heartbeat_interval", lambda: None)()
        hb = Heartbeat(self.storage, max(1.0, interval / 2) if interval else None)
        pending: list[tuple[optuna.Trial, dict[str, Any]]] = []
        stopped = StopReason.N_TRIALS
        lost = False
        try:
            while True:
                if self.counted >= n_trials:
                    stopped = StopReason.N_TRIALS
                    break
                if timeout_s is not None and time.monotonic() - t0 >= timeout_s:
                    stopped = StopReason.TIMEOUT
                    break
                if patience is not None and self.evaluated - self.best_at >= patience:
                    stopped = StopReason.PATIENCE
                    break
                if should_stop is not None and should_stop():
                    stopped = StopReason.CANCELLED
                    break
                if len(self.seen) >= len(self.grid):
                    stopped = StopReason.SPACE_EXHAUSTED
                    break
                if self.rejected + self.cached >= limit_rej:
                    stopped = StopReason.SAMPLER_STUCK
                    break
                if not pending or (self.ahead and len(pending) < batch):
                    # Never more in hand than the trials still to evaluate (n >= 1 when the
                    # hand is empty: rejected and cached answers do not count as evaluated).
                    n = min(batch - len(pending), n_trials - self.counted - len(pending))
                    if n > 0:
                        pending += self._ask_batch(n, hb)
                self._maybe_near_end(n_trials, timeout_s, time.monotonic() - t0)
                trial, cfg = pending.pop(0)
                try:
                    self._evaluate(trial, cfg, progress, n_trials)
                except TrialCancelled:
                    pending.insert(0, (trial, cfg))  # failed and queued again below
                    stopped = StopReason.CANCELLED
                    break
                finally:
                    hb.remove(trial._trial_id)
        except LeaseLost:
            lost = True  # the study is someone else's now: nothing more is written to it
            raise
        finally:
            # Trials asked ahead but not run: failed (they count for nothing) and queued again
            # with the same parameters, so a resumed study still evaluates them.
            for trial, _ in [] if lost else pending:
                try:
                    self.study.tell(trial, state=TrialState.FAIL)
                    self.study.enqueue_trial(trial.params)
                except optuna.exceptions.UpdateFinishedTrialError:
                    pass  # failed meanwhile by the study's next holder, which re-runs it
                hb.remove(trial._trial_id)
            hb.stop()
        return stopped

    def _maybe_near_end(self, n_trials: int, timeout_s: float | None, elapsed: float) -> None:
        if self.near_end is None:
            return
        if 2 * self.counted < n_trials and (timeout_s is None or 2 * elapsed < timeout_s):
            return
        hook, self.near_end = self.near_end, None
        try:
            hook()
        except Exception as exc:  # a look-ahead hint must never fail the case being tuned
            log.warning("prefetch of the next case after %s %s skipped: %s", self.kernel, self.axes, exc)

    def _ask_batch(self, n: int, hb: Heartbeat) -> list[tuple[optuna.Trial, dict[str, Any]]]:
        out = []
        with warnings.catch_warnings():
            # Heartbeats are recorded by Heartbeat: Optuna's hint about optimize() does not apply.
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            fail_stale_trials(self.study)
            for _ in range(max(1, n)):
                trial = self.study.ask()
                hb.add(trial._trial_id)
                out.append((trial, self._config(trial)))
        if self.ahead:
            fresh = [c for _, c in out
                     if self.space.violation(c) is None and self.space.key(c) not in self.seen]
            self.runner.prefetch(self.kernel, self.axes, [self.space.canonical(c) for c in fresh])
        return out

    def _tell(self, trial: optuna.Trial, value: float, feasible: bool) -> None:
        trial.set_constraint(CONSTRAINT, 0.0 if feasible else 1.0)
        with warnings.catch_warnings():
            # CMA-ES ignores constraints and says so on every trial; it still gets the penalty.
            warnings.filterwarnings("ignore", message="Constraints have been set")
            self.study.tell(trial, value)

    def _tell_infeasible(self, trial: optuna.Trial) -> None:
        self._tell(trial, self._penalty(), feasible=False)

    def _evaluate(self, trial: optuna.Trial, cfg: dict[str, Any],
                  progress: Callable[[int, int, float | None], None] | None, n_trials: int) -> None:
        why = self.space.violation(cfg)
        if why is not None:
            trial.set_user_attr(A_STATE, TrialMark.REJECTED)
            trial.set_user_attr(A_MSG, why)
            self.rejected += 1
            self._tell_infeasible(trial)
            return
        full = self.space.canonical(cfg)
        key = config_key(full)
        trial.set_user_attr(A_CONFIG, full)
        known = self.seen.get(key)
        if known is not None:
            # Asked again: answer from memory, never run twice.
            self.cached += 1
            ok = known["state"] == TrialMark.OK
            trial.set_user_attr(A_STATE, TrialMark.CACHED_OK if ok else TrialMark.CACHED_FAIL)
            if ok:
                self._tell(trial, known["value"], feasible=True)
            else:
                trial.set_user_attr(A_KIND, known.get("kind"))
                self._tell_infeasible(trial)
            return
        out = self.runner.run(self.kernel, self.axes, full, measure_n=self.measure_n,
                              seed=self.options.seed or 0, cancel=self.hooks.cancel)
        for ph, v in (("compile", out.compile_s), ("check", out.check_s),
                      ("measure", out.measure_s), ("wait", out.compile_wait_s)):
            self.phase[ph] += v
        try:
            self._store_outcome(trial, out)
        except optuna.exceptions.UpdateFinishedTrialError as exc:
            # Another worker failed this trial while it ran (it took the study over after our
            # lease lapsed): the outcome is not the study's, so it counts for nothing here. It
            # costs this trial, never the job; a lost lease stops the loop at its next write.
            log.warning("trial %d of %s was finished by another worker; outcome dropped: %s",
                        trial.number, self.study.study_name, exc)
            return
        self.run_now += 1
        self.evaluated += 1
        self.counted += 1
        if out.ok:
            value = float(out.timing["median_us"])
            if self._remember_ok(key, value, full, out.as_dict()):
                self.best_at = self.evaluated
            self.history.append(value)
        else:
            self.failed += 1
            self.seen[key] = {"state": TrialMark.FAIL, "kind": out.failure_kind, "message": out.message}
            self._count_failure(out.failure_kind, out.message, new=True)
            self.history.append(None)
        if self.options.summaries:
            self._summary(trial, full, out)
        if progress is not None:
            progress(self.counted, n_trials, self.best[0] if self.best else None)

    def _store_outcome(self, trial: optuna.Trial, out: TrialOutcome) -> None:
        """The evaluated trial's attributes and its tell (Optuna's writes of its outcome)."""
        if self.options.run_tag is not None:
            trial.set_user_attr(A_TAG, self.options.run_tag)
        trial.set_user_attr(A_RUN, True)
        trial.set_user_attr(A_OUT, _finite_or_none(out.as_dict()))
        if out.ok:
            trial.set_user_attr(A_STATE, TrialMark.OK)
            self._tell(trial, float(out.timing["median_us"]), feasible=True)
        else:
            trial.set_user_attr(A_STATE, TrialMark.FAIL)
            trial.set_user_attr(A_KIND, out.failure_kind)
            trial.set_user_attr(A_MSG, out.message[:2000])
            self._tell_infeasible(trial)

    def _summary(self, trial: optuna.Trial, cfg: dict[str, Any], out: TrialOutcome) -> None:
        extra = _finite_or_none({k: v for k, v in out.as_dict().items()
                           if k not in ("ok", "failure_kind", "message")})
        extra["sampler"] = self.options.sampler
        try:
            self.store.add_trial_summary(
                self.study.study_name, self.kernel, self.device, self.axes, trial.number,
                TrialStatus.COMPLETE if out.ok else TrialStatus.FAIL, cfg,
                out.timing.get("median_us") if out.ok else None,
                out.failure_kind, out.message or None, extra, job_id=self.options.job_id)
        except LeaseLost:
            raise
        except Exception as exc:  # the study holds the trial; a lost summary is only a log line
            log.warning("trial summary of %s #%d not stored: %s", self.study.study_name,
                        trial.number, exc)

    # -- results ---------------------------------------------------------------------------
    def result(self, stopped: StopReason, warm: int) -> CaseResult:
        best = self.best
        return CaseResult(
            key=CaseKey(kernel=self.kernel, axes=dict(self.axes), device=self.device,
                        study_name=self.study.study_name, sampler=self.options.sampler),
            stopped_because=stopped,
            best=BestFound(config=dict(best[1]) if best else None,
                           latency_us=best[0] if best else None,
                           timing_method=(best[2].get("timing") or {}).get("method") if best else None),
            trials=TrialCounts(n_complete=self.evaluated - self.failed, n_failed=self.failed,
                               n_rejected=self.rejected, n_cached=self.cached, n_run_now=self.run_now,
                               n_counted=self.counted, warm_started=warm, history=list(self.history)),
            times=PhaseTimes(compile_s=self.phase["compile"], check_s=self.phase["check"],
                             measure_s=self.phase["measure"], compile_wait_s=self.phase["wait"]),
            failures=Failures(new_kinds=dict(self.new_failure_kinds), kinds=dict(self.failure_kinds),
                              first=self.first_new_failure or self.first_failure))

    def best_trial(self) -> BestTrial | None:
        """The study's best so far, for its record (search_space.records)."""
        if self.best is None:
            return None
        value, cfg, outcome = self.best
        return BestTrial(kernel=self.kernel, axes=dict(self.axes), device=self.device,
                         study_name=self.study.study_name, latency_us=value, config=dict(cfg),
                         outcome=outcome, n_trials=self.evaluated, n_failed=self.failed)


def _finite_or_none(d: Any) -> Any:
    """A copy whose NaN/inf are None: Optuna stores user attributes as strict JSON."""
    if isinstance(d, dict):
        return {str(k): _finite_or_none(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_finite_or_none(v) for v in d]
    if isinstance(d, float) and not math.isfinite(d):
        return None
    return d


__all__ = ["tune_case", "TuneOptions", "TuneHooks", "study_name", "CaseResult", "CaseKey", "BestFound",
           "TrialCounts", "PhaseTimes", "Failures", "TuneError", "SAMPLERS", "StopReason", "TrialMark", "make_sampler",
           "make_storage", "RetryingRDBStorage", "fail_running_trials", "warm_start_configs", "warm_start_picks", "prefetch_case"]
