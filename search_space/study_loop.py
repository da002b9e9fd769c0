"""The ask/tell loop of one case's Optuna study (`_Loop` over a `CaseStudy`).

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

import json
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import optuna
from optuna.storages import BaseStorage, fail_stale_trials
from optuna.trial import TrialState

from kernelsearch.db.errors import LeaseLost
from kernelsearch.db.interfaces import TuningStore
from kernelsearch.db.statuses import TrialStatus
from kernelsearch.kernels.configs import canonical_key
from kernelsearch.kernels.spec import config_key

from .case_result import BestFound, CaseKey, CaseResult, Failures, PhaseTimes, TrialCounts
from .heartbeat import Heartbeat
from .records import BestTrial
from .runner import TrialCancelled, TrialOutcome, TrialRunner
from .space import SearchSpace
from .states import StopReason, TrialMark
from .tune_options import TuneHooks, TuneOptions
from .warm_start import enqueue_warm_start, prefetch_case

log = logging.getLogger(__name__)

CONSTRAINT = "ks_failure"
# Attributes the tuner keeps on each Optuna trial (user_attrs).
A_CONFIG, A_STATE, A_KIND, A_MSG, A_OUT, A_RUN, A_TAG = (
    "ks_config", "ks_state", "ks_failure_kind", "ks_message", "ks_outcome", "ks_evaluated",
    "ks_run_tag")


def _state_of(t: optuna.trial.FrozenTrial) -> TrialMark | None:
    """The tuner's mark on a trial; None for a trial without one (or with one it does not know)."""
    st = t.user_attrs.get(A_STATE)
    try:
        return None if st is None else TrialMark(st)
    except ValueError:
        return None


def _prefetch_next(loop: "_Loop", next_case: tuple[str, Mapping[str, int]]) -> int:
    """The next case's warm-start configs to the pool; of the same kernel, with this case's best
    so far, which becomes the next case's nearest neighbour once this case writes its record."""
    kernel, axes = next_case
    same = kernel == loop.kernel
    also = [loop.best[1]] if same and loop.best is not None else []
    return prefetch_case(loop.runner, loop.store, kernel, axes, loop.device,
                         space=loop.space if same else None, also=also)


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


__all__ = ["CaseStudy", "CONSTRAINT", "A_CONFIG", "A_STATE", "A_KIND", "A_MSG", "A_OUT", "A_RUN", "A_TAG"]
