"""The worker: claims queued jobs from the database and tunes them case by case.

Several workers (threads, processes, hosts) share one database: a job is claimed with a lease
that a heartbeat thread renews; a job whose worker stopped heartbeating is claimed again by
another, and its Optuna studies continue from their stored trials (a job's trials carry its
tag, and tune_case counts them toward the job's n_trials), so no trial is lost or counted twice.
A job adds n_trials to each case's study. A case is tuned only under its study's claim, so jobs
sharing a case never tune it at once. A transient database failure costs a retry of the case
(resuming its study), never the job; a worker told to stop hands its job back to the queue.
Leases are fenced (db.repos.jobs): a worker that lost its lease (its heartbeats hung past it,
and another worker claimed the job) gets LeaseLost from its next write, and leaves the job, its
study and its trials to the new holder without touching them.
Cancelling a job kills its trial in flight. Candidates run in the tuner's TrialRunner child
process, so a crashing or hanging kernel never takes us down. A job's kind (statuses.JobKind,
set at submission) picks its handler. The worker creates no CUDA context (its children report
the device) and spawns every child: one forked from a process that probed CUDA cannot use it.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Self

from kernelsearch.db.engine import is_transient, retrying
from kernelsearch.db.errors import LeaseLost, StoreError, StoreUnavailable
from kernelsearch.db.interfaces import JobQueue, Lease, WorkerStore
from kernelsearch.db.statuses import JobKind, JobStatus, RecordOrigin
from kernelsearch.kernels.errors import KernelSearchError
from kernelsearch.kernels.registry import resolve
from kernelsearch.search_space.states import CUT_SHORT

from . import search_jobs
from .metrics import Metrics
from .settings import Settings

if TYPE_CHECKING:
    from kernelsearch.search_space.tuner import CaseResult

log = logging.getLogger(__name__)


def default_owner() -> str:
    """host:pid:uuid, unique per worker even with several in one process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class _Periodic:
    """Runs `tick()` every `interval` s in a thread while the job runs, until it returns True."""

    name = "ks-periodic"

    def __init__(self, job_id: int, interval: float) -> None:
        self.job_id, self.interval = job_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-{job_id}", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.tick():
                return

    def tick(self) -> bool:
        raise NotImplementedError


class _Lease(_Periodic):
    """Renews a job's lease every `interval` s in a thread; `lost` is set once the lease is no
    longer held (claimed again, cancelled or finished)."""

    name = "ks-heartbeat"

    def __init__(self, store: JobQueue, lease: Lease, interval: float) -> None:
        super().__init__(lease.job_id, interval)
        self.store, self.lease = store, lease
        self.lost = threading.Event()

    def tick(self) -> bool:
        try:
            self.store.heartbeat(self.lease)
        except LeaseLost as exc:
            log.info("%s", exc)
            self.lost.set()
            return True
        except StoreUnavailable as exc:
            # Keep trying: the lease only expires after lease_seconds without a heartbeat.
            log.warning("heartbeat of job %s failed: %s", self.job_id, exc)
        return False


class _CancelWatch(_Periodic):
    """Polls the job's status every `interval` s in a thread; `cancelled` is set once it reads
    cancelled, so the trial in flight is killed within about `interval` s, not after it ends."""

    name = "ks-cancel"

    def __init__(self, store: JobQueue, job_id: int, interval: float) -> None:
        super().__init__(job_id, interval)
        self.store = store
        self.cancelled = threading.Event()

    def tick(self) -> bool:
        try:
            job = self.store.get_job(self.job_id)
        except StoreError as exc:  # the lease decides about an unreachable database
            log.debug("cancel check of job %s failed: %s", self.job_id, exc)
            return False
        if job is not None and job.status == JobStatus.CANCELLED:
            self.cancelled.set()
            return True
        return False


class Worker:
    """Claims and runs jobs; `run_forever(stop)` loops, `run_one()` handles at most one job."""

    def __init__(self, settings: Settings, store: WorkerStore, *, owner: str | None = None,
                 metrics: Metrics | None = None,
                 on_records_changed: Callable[[], None] | None = None,
                 runner: Any | None = None, kernel_modules: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.store = store
        self.owner = owner or settings.worker_id or default_owner()
        self.metrics = metrics
        self.on_records_changed = on_records_changed
        self.kernel_modules = kernel_modules
        self._runner = runner
        self._own_runner = runner is None
        self.stop_event = threading.Event()
        self._cancel_watch: _CancelWatch | None = None
        # This claim's end under KS_JOB_MAX_SECONDS (time.monotonic()); None between jobs.
        self._limit_at: float | None = None
        # When the claimed job must stop: its own timeout, within _limit_at.
        self._deadline_at = 0.0

    # -- the runner ---------------------------------------------------------------------------
    @property
    def runner(self) -> Any:
        """The tuner's child-process trial runner, started on first use and kept for all jobs."""
        if self._runner is None:
            from kernelsearch.search_space.runner import TrialRunner

            self._runner = TrialRunner(trial_timeout_s=self.settings.trial_timeout_s,
                                       kernel_modules=self.kernel_modules)
        return self._runner

    def close(self) -> None:
        if self._own_runner and self._runner is not None:
            self._runner.close()
            self._runner = None

    # -- loops --------------------------------------------------------------------------------
    def run_forever(self, stop_event: threading.Event | None = None) -> None:
        """Claim and run jobs until `stop_event` is set; a running job stops after its trial."""
        if stop_event is not None:
            self.stop_event = stop_event
        stop = self.stop_event
        log.info("worker %s started", self.owner)
        try:
            while not stop.is_set():
                try:
                    worked = self.run_one()
                except StoreUnavailable as exc:
                    log.warning("worker %s: database unavailable: %s", self.owner, exc)
                    worked = False
                except Exception:
                    log.exception("worker %s: unexpected error; continuing", self.owner)
                    worked = False
                if not worked:
                    stop.wait(self.settings.worker_poll_seconds)
        finally:
            self.close()
            log.info("worker %s stopped", self.owner)

    def run_one(self) -> bool:
        """Claim one job and run it to its end; False when no job was waiting."""
        job = self.store.claim_job(self.owner, self.settings.lease_seconds,
                                   max_claims=self.settings.job_max_claims)
        if job is None:
            return False
        log.info("worker %s claimed job %s (%s, %d cases, attempt %d)", self.owner, job.id,
                 job.kernel, len(job.cases), job.attempts)
        held = Lease.of(job)
        with _Lease(self.store, held, self.settings.heartbeat_seconds) as lease, \
                _CancelWatch(self.store, job.id, self.settings.cancel_poll_seconds) as watch:
            self._cancel_watch = watch
            try:
                status, error = self._run_job(job, held, lease)
            except LeaseLost as exc:
                # Someone else holds the job now: leave it, and everything of it, as it is.
                log.warning("worker %s left job %s: %s", self.owner, job.id, exc)
                return True
            except _LeaveJob as exc:
                handed = self._hand_back(held)
                log.warning("worker %s left job %s%s: %s", self.owner, job.id,
                            " to another worker" if handed else "", exc)
                # One poll interval before the next claim: another worker takes the job first.
                self.stop_event.wait(self.settings.worker_poll_seconds)
                return True
        if status is None:
            cancelled = self._cancelled(job.id)
            why = "cancelled" if cancelled else "lease lost or worker stopping"
            if not cancelled and self._hand_back(held):
                why += "; handed back to the queue"
            log.info("worker %s left job %s: %s", self.owner, job.id, why)
            return True
        try:
            self.store.finish_job(held, status, error=error)
        except LeaseLost as exc:
            log.warning("worker %s left job %s unfinished: %s", self.owner, job.id, exc)
            return True
        log.info("job %s %s%s", job.id, status, f": {error}" if error else "")
        return True

    def _hand_back(self, lease: Lease) -> bool:
        """Requeue a job we leave unfinished at once, so another worker need not wait for the
        lease to expire; a database that cannot answer leaves that to the lease."""
        try:
            self.store.release_job(lease)
            return True
        except LeaseLost:
            return False
        except StoreError as exc:
            log.warning("job %s not handed back (%s); its lease expires instead", lease.job_id, exc)
            return False

    def _claim_study(self, name: str | None, lease: Lease, should_stop: Callable[[], bool]) -> bool:
        """Hold the case's study before tuning it, waiting while another worker tunes it (its
        trials then count for both jobs); False when told to stop while waiting."""
        if name is None:
            return True
        waited = False
        while (holder := self.store.claim_study(name, lease, self.settings.lease_seconds)) is not None:
            if not waited:
                log.info("job %s: study %s is being tuned by %s; waiting", lease.job_id, name, holder)
                waited = True
            if should_stop():
                return False
            self.stop_event.wait(min(1.0, self.settings.worker_poll_seconds))
        return True

    def _release_study(self, name: str | None, lease: Lease) -> None:
        if name is None:
            return
        try:
            self.store.release_study(name, lease)
        except StoreError as exc:  # the claim expires with the lease
            log.warning("study %s not released: %s", name, exc)

    def _tune_retrying(self, call: Callable[[], Any], should_stop: Callable[[], bool]) -> Any:
        """Run one case, again (resuming its study) after a transient database failure, with
        backoff for up to db_retry_seconds; a kernel's own failure is not retried."""
        policy = retrying(self.settings.db_retry_seconds)
        policy = policy.copy(stop=policy.stop | (lambda _state: should_stop()))
        return policy(call)

    def _cancelled(self, job_id: int) -> bool:
        try:
            job = self.store.get_job(job_id)
        except StoreError:
            return False
        return job is not None and job.status == JobStatus.CANCELLED

    def _run_job(self, job: Any, held: Lease, lease: _Lease) -> tuple[JobStatus | None, str | None]:
        """(final status, error), or (None, None) when the job must be left as it is; LeaseLost
        from any write once another worker holds the job. One handler per kind of job."""
        self._limit_at = time.monotonic() + self.settings.job_max_seconds
        self._deadline_at = min(time.monotonic() + job.timeout_s, self._limit_at) if job.timeout_s else self._limit_at
        handlers: dict[JobKind, Callable[[Any, Lease, _Lease], tuple[JobStatus | None, str | None]]] = {
            JobKind.DECLARED: self._run_declared_job,
            JobKind.CAPTURE: self._run_capture_job,
            JobKind.SEARCH: self._run_search_job,
            JobKind.HELION: self._run_helion_job,
        }
        return handlers[job.kind](job, held, lease)

    def _run_declared_job(self, job: Any, held: Lease, lease: _Lease) -> tuple[JobStatus | None, str | None]:
        """A registered kernel's cases, tuned by Optuna in the trial child."""
        try:
            resolve(job.kernel)
        except KernelSearchError as exc:
            # A kernel this worker cannot import fails its job, not the worker.
            return JobStatus.FAILED, f"kernel {job.kernel!r} is not available on worker {self.owner}: {exc}"
        return self._tune_cases(job, held, lease)

    def _run_capture_job(self, job: Any, held: Lease, lease: _Lease) -> tuple[JobStatus | None, str | None]:
        """An undeclared kernel's captured call, tuned over its config list as a declared one's;
        where the kernel sends a search space, the key's search job is queued after it."""
        failed = self._captured_kernel(job)
        if failed is not None:
            return JobStatus.FAILED, failed
        status, error = self._tune_cases(job, held, lease)
        if status == JobStatus.SUCCEEDED:
            self._queue_search(job)
        return status, error

    def _queue_search(self, job: Any) -> None:
        """The search beyond the list of a key whose kernel sent configs to search: queued (not
        run here) so the list's winner is served first, as `kernelsearch search` would queue it."""
        definition = getattr(resolve(job.kernel), "definition", None)
        if definition is None or not definition.search_space or job.capture is None:
            return
        try:
            queued, existing = self.store.queue_job(
                job.kernel, list(job.cases), self.settings.search_trials, search_jobs.SEARCH,
                self.settings.search_seconds * 2, self.settings.max_queued_jobs, job.capture)
        except (StoreError, ValueError) as exc:
            log.warning("job %s: the search of its key was not queued: %s", job.id, exc)
            return
        if not existing:
            log.info("job %s: queued search job %s beyond %s's list", job.id, queued.id, job.kernel)

    def _run_search_job(self, job: Any, held: Lease, lease: _Lease) -> tuple[JobStatus | None, str | None]:
        """A captured key searched beyond its config list, in a job child (service.search_jobs)."""
        failed = self._captured_kernel(job)
        if failed is not None:
            return JobStatus.FAILED, failed
        return search_jobs.run_search_job(
            self.store, self.settings, job, held, owner=self.owner,
            stop=lambda: self.stop_event.is_set() or lease.lost.is_set(),
            limit_s=max(0.001, self._deadline_at - time.monotonic()),
            device_info=self.runner.device_info or {})

    def _tune_cases(self, job: Any, held: Lease, lease: _Lease) -> tuple[JobStatus | None, str | None]:
        """Tune the job's cases one by one with Optuna, its kernel registered here."""
        from kernelsearch.search_space.tuner import TuneHooks, TuneOptions, tune_case

        deadline = self._deadline_at

        def should_stop() -> bool:
            return (self.stop_event.is_set() or lease.lost.is_set()
                    or time.monotonic() >= deadline)

        try:
            device = self.runner.device_name
        except Exception as exc:
            return JobStatus.FAILED, f"trial runner did not start: {type(exc).__name__}: {exc}"
        best: dict[str, Any] = dict(job.best or {})
        results: list[dict[str, Any]] = list(best.get("cases", []))
        done_before = 0
        for i, axes in enumerate(job.cases):
            if should_stop():
                break
            base = done_before
            self.store.update_job_progress(held, trials_done=base, device=device,
                                           current_case={"index": i, "axes": axes})

            def progress(done: int, total: int, best_us: float | None, _base: int = base,
                         _axes: dict = axes, _i: int = i) -> None:
                cur = {"index": _i, "axes": _axes, "trials_done": done, "n_trials": total,
                       "best_latency_us": best_us}
                self.store.update_job_progress(held, trials_done=_base + done, current_case=cur)

            def tune() -> Any:
                remaining = max(0.001, deadline - time.monotonic())
                options = TuneOptions(
                    n_trials=job.n_trials, sampler=job.sampler, timeout_s=remaining, job_id=job.id,
                    measure_n=self.settings.measure_n, run_tag=f"job:{job.id}",
                    reference=self.settings.tune_reference, exclusive=study is not None,
                    lease=held if study is not None else None,
                    next_case=(job.kernel, job.cases[i + 1]) if i + 1 < len(job.cases) else None)
                return tune_case(job.kernel, axes, store=self.store.under_lease(held),
                                 storage=self.settings.database_url,
                                 runner=self.runner, options=options,
                                 hooks=TuneHooks(progress=progress, should_stop=should_stop,
                                                 cancel=self._job_cancelled))

            study = _study_of(job.kernel, axes, device)
            if not self._claim_study(study, held, should_stop):
                break
            try:
                result: CaseResult = self._tune_retrying(tune, should_stop)
            except LeaseLost:
                raise
            except Exception as exc:
                if is_transient(exc):
                    log.warning("job %s: case %s left after database failures: %s", job.id, axes, exc)
                    return None, None
                log.exception("job %s: case %s failed", job.id, axes)
                return JobStatus.FAILED, f"case {axes}: {type(exc).__name__}: {exc}"
            finally:
                self._release_study(study, held)
            summary = case_summary(axes, result)
            results = [r for r in results if r.get("axes") != axes] + [summary]
            best = {"cases": results}
            done_before += summary["trials_done"]
            try:
                self.store.update_job_progress(held, trials_done=done_before, best=best)
            except LeaseLost:
                if self._cancelled(job.id):
                    # Cancelled while this case ran: its record is stored, and the job reports it.
                    self.store.keep_cancelled_best(held, trials_done=done_before, best=best)
                raise
            if self.on_records_changed is not None:
                self.on_records_changed()
            if result.stopped_because.cut_short:
                break
        if self._past_limit():
            finished = sum(1 for r in results if r["stopped_because"] not in CUT_SHORT)
            return JobStatus.FAILED, self._limit_error(
                f"{finished} of {len(job.cases)} cases fully tuned, their records kept")
        if lease.lost.is_set() or self.stop_event.is_set() or self._job_cancelled():
            return None, None
        if time.monotonic() >= deadline:
            finished = sum(1 for r in results if r["stopped_because"] not in CUT_SHORT)
            if finished < len(job.cases):
                return JobStatus.FAILED, (f"timed out after {job.timeout_s:g} s with {finished} of "
                                  f"{len(job.cases)} cases fully tuned (their records are kept)")
        if not any(r.get("best_latency_us") is not None for r in results):
            why = "; ".join(f"case {r['axes']}: {r['failures']}" for r in results if r.get("failures"))
            return JobStatus.FAILED, f"no valid config found: {why or 'every trial failed'}"
        return JobStatus.SUCCEEDED, None

    def _run_helion_job(self, job: Any, held: Lease, lease: _Lease) -> tuple[JobStatus | None, str | None]:
        """Tune a Helion cache miss's captured call with Helion's own search, in a disposable
        child process, and store the entry under the job's key, through the gate a put passes,
        fenced by the job's lease. A module the operator does not trust, or arguments beyond
        this worker's bounds, fail the job; a worker that cannot import the kernel's module hands
        the job back as for a captured Triton call."""
        from kernelsearch.kernels.capture import KernelModuleUnavailable
        from kernelsearch.search_space.acceptance import RecordRejected, accepted_helion
        from kernelsearch.search_space.compiled import store_helion_compiled

        from kernelsearch.search_space.helion_job import check_job, parse_job

        from . import helion_jobs
        from .job_child import JobChildStopped

        try:
            hjob = parse_job(job.capture)
        except ValueError as exc:
            return JobStatus.FAILED, f"capture: {exc}"
        refused = check_job(hjob, self.settings, self._bounds_for(hjob.device))
        if refused is not None:
            return JobStatus.FAILED, refused
        self.store.update_job_progress(held, trials_done=0, current_case={"index": 0, "axes": job.cases[0]})
        limit_at = self._limit_at if self._limit_at is not None else time.monotonic() + self.settings.job_max_seconds

        def stop() -> bool:  # KS_JOB_MAX_SECONDS is the child's limit_s: a failure, not a stop
            watch = self._cancel_watch
            return (self.stop_event.is_set() or lease.lost.is_set()
                    or (watch is not None and watch.cancelled.is_set()))

        try:
            tuned = helion_jobs.tune(hjob, self.owner, stop=stop,
                                     limit_s=max(0.001, limit_at - time.monotonic()))
        except JobChildStopped as exc:
            if exc.timed_out:
                return JobStatus.FAILED, self._limit_error("Helion's search")
            return None, None
        except KernelModuleUnavailable as exc:
            if job.attempts < self.settings.capture_import_tries:
                raise _LeaveJob(str(exc)) from None
            return JobStatus.FAILED, f"{exc} (claim {job.attempts} of {self.settings.capture_import_tries})"
        except helion_jobs.HelionJobError as exc:
            return JobStatus.FAILED, str(exc)
        try:
            entry = accepted_helion(tuned.key, tuned.data, kernel=hjob.kernel, arg_names=hjob.arg_names,
                                    checked=tuned.checked, by=f"worker {self.owner}"[:200],
                                    host=socket.gethostname(), origin=RecordOrigin.WORKER)
        except RecordRejected as exc:
            return JobStatus.FAILED, f"the tuned entry was refused by the gate: {exc}"
        fenced = self.store.under_lease(held)
        fenced.put_helion_entry(entry)
        stored = sum(store_helion_compiled(fenced, tuned.key, ref) for ref in tuned.compiled)
        self.store.update_job_progress(held, trials_done=1, device=tuned.hardware,
                                       best={"helion_key": tuned.key, "config": tuned.config,
                                             "compiled_groups": stored})
        if self.on_records_changed is not None:
            self.on_records_changed()
        return JobStatus.SUCCEEDED, None

    def _captured_kernel(self, job: Any) -> str | None:
        """Register the kernel of a job that tunes on a call's capture; the job's error when it
        cannot be made. Its module must be one the operator trusts and the capture within this
        worker's bounds; the module is imported in the trial child only (a module that exits or
        crashes on import fails the job, naming it, and costs the child). A worker that cannot
        import the module hands the job back (`_LeaveJob`) for one that can, until the job's
        KS_CAPTURE_IMPORT_TRIES-th claim, which fails it naming the module and the fix."""
        from kernelsearch.kernels import registry
        from kernelsearch.kernels.capture import (IN_TRIAL_CHILD, Capture, CaptureError,
                                                  KernelCodeFailed, KernelModuleUnavailable,
                                                  captured_kernel)
        from kernelsearch.kernels.undeclared import Definition, UndeclaredKernel

        from kernelsearch.search_space.job_policy import module_refusal, worker_bounds

        stored = getattr(self.store, "kernel_definitions", None)
        doc = (stored() if stored is not None else {}).get(job.kernel)
        if doc is None:
            try:
                known = registry.get_kernel(job.kernel)
            except KeyError:
                known = None
            if isinstance(known, UndeclaredKernel):
                doc = known.definition.as_json()
        if doc is None:
            return f"capture: {job.kernel!r} has no registered definition (POST /v1/kernels)"
        try:
            defn = Definition.from_json(doc)
            capture = Capture.from_json(job.capture)
        except (CaptureError, ValueError) as exc:
            return f"capture: {exc}"
        refused = module_refusal(defn.module, self.settings)
        if refused is not None:
            return f"kernel: {refused}"
        try:
            self.runner.start()
        except Exception as exc:
            return f"trial runner did not start: {type(exc).__name__}: {exc}"
        try:
            kdef = captured_kernel(defn, capture, tuner=IN_TRIAL_CHILD)
            capture.check_bounds(worker_bounds(self.settings, self.runner.device_info), key=defn.key)
            self.runner.load_kernel(kdef.child_spec())
        except KernelModuleUnavailable as exc:
            if job.attempts < self.settings.capture_import_tries:
                raise _LeaveJob(str(exc)) from None
            return f"{exc} (claim {job.attempts} of {self.settings.capture_import_tries})"
        except KernelCodeFailed as exc:
            return str(exc)
        except (CaptureError, ValueError) as exc:
            return f"capture: {exc}"
        registry.register(kdef, replace=True)
        return None

    def _bounds_for(self, device_type: str) -> Any:
        """A Helion job's bounds on this worker: the CPU's for a CPU call; for a GPU call the
        trial child's device when it started (the worker itself never touches the GPU), else
        the API's."""
        from kernelsearch.search_space.job_policy import submit_bounds, worker_bounds

        if device_type == "cpu":
            return worker_bounds(self.settings, None)
        info = self._runner.device_info if self._runner is not None else None
        if info is not None and info.get("memory_bytes"):
            return worker_bounds(self.settings, info)
        return submit_bounds(self.settings)

    def _past_limit(self) -> bool:
        return self._limit_at is not None and time.monotonic() >= self._limit_at

    def _limit_error(self, what: str) -> str:
        return (f"ran past KS_JOB_MAX_SECONDS ({self.settings.job_max_seconds:g} s) on worker "
                f"{self.owner}: stopped, a trial or search in flight killed with its child "
                f"process ({what})")

    def _job_cancelled(self) -> bool:
        """Asked while a trial runs: a cancelled job, or one past KS_JOB_MAX_SECONDS, stops it
        now (its child killed; a SIGTERM lets it end)."""
        watch = self._cancel_watch
        return (watch is not None and watch.cancelled.is_set()) or self._past_limit()


class _LeaveJob(Exception):
    """This worker cannot run the job, another may: it goes back to the queue."""


def worker_store(settings: Settings) -> WorkerStore:
    """The store a worker uses: its own pool, and transient failures retried for
    KS_DB_RETRY_SECONDS, so a dropped connection costs a retry, never a job."""
    from kernelsearch.db.store import Store

    return Store(settings.database_url, retry_s=settings.db_retry_seconds)


def _study_of(kernel: str, axes: dict[str, int], device: str) -> str | None:
    """The study a case is tuned in (None for axes the tuner will reject anyway)."""
    from kernelsearch.kernels import get_kernel
    from kernelsearch.search_space.tuner import study_name

    try:
        return study_name(kernel, get_kernel(kernel).validate_axes(axes), device)
    except (KeyError, ValueError):
        return None


def case_summary(axes: dict[str, int], result: CaseResult) -> dict[str, Any]:
    """A job's view of one tuned case (from the tuner's CaseResult)."""
    return {
        "axes": dict(axes),
        "best_latency_us": result.best.latency_us,
        "best_config": result.best.config,
        "trials_done": int(result.trials.n_counted),
        "n_failed": int(result.trials.n_failed),
        "failures": result.failure_summary() if result.best.latency_us is None else None,
        "stopped_because": result.stopped_because,
        "improved": bool(result.best.improved),
        "timing_method": result.best.timing_method,
    }
