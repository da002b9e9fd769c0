"""The tuner: one Optuna study per (kernel, case, device) in the project's database.

`tune_case` opens (or resumes) the case's study, runs its ask/tell loop (study_loop.py) and
writes or improves the case's best record. Its options and hooks are in tune_options.py, its
result in case_result.py, its samplers in samplers.py, warm start in warm_start.py; their
public names are importable from here too.
"""
from __future__ import annotations

import logging
import re
import time
import warnings
from dataclasses import replace
from typing import Any, Callable, Mapping

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from kernelsearch.db.checks import bounded_name
from kernelsearch.db.errors import LeaseLost
from kernelsearch.db.interfaces import Lease, RecordRepository, TuningStore
from kernelsearch.db.optuna_storage import RetryingStorage, open_optuna_storage
from kernelsearch.kernels import get_kernel
from kernelsearch.kernels.undeclared import UndeclaredKernel
from kernelsearch.kernels.measure import default_repeats

from .case_result import BestFound, CaseKey, CaseResult, Failures, PhaseTimes, TrialCounts
from .compiled import store_compiled
from .records import best_record
from .runner import TrialRunner
from .samplers import make_sampler
from .space import SearchSpace, case_space, get_space
from .states import StopReason, TrialMark
from .study_loop import A_CONFIG, A_KIND, A_MSG, A_OUT, A_RUN, A_STATE, A_TAG, CaseStudy, _Loop
from .tune_options import SAMPLERS, TuneError, TuneHooks, TuneOptions
from .warm_start import prefetch_case, warm_start_configs, warm_start_picks

log = logging.getLogger(__name__)


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


__all__ = ["tune_case", "TuneOptions", "TuneHooks", "study_name", "CaseResult", "CaseKey", "BestFound",
           "TrialCounts", "PhaseTimes", "Failures", "TuneError", "SAMPLERS", "StopReason", "TrialMark", "make_sampler",
           "make_storage", "RetryingRDBStorage", "fail_running_trials", "warm_start_configs", "warm_start_picks", "prefetch_case",
           "A_CONFIG", "A_STATE", "A_KIND", "A_MSG", "A_OUT", "A_RUN", "A_TAG"]
