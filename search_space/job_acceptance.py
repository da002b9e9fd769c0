"""The one way a tuning job enters the queue: the REST routes (`POST /v1/jobs`,
`POST /v1/helion/jobs`) and a user's program that queues into its local store (the decorator's
fallback) all go through `accept_job` / `accept_helion_job`, so the operator's limits, the
sampler, the cases and a capture's checks hold whoever queues. A refusal is `JobRefused`, whose
message names the field or the setting (the routes answer it with its HTTP status). It sits below
the server and the client, so both apply this one definition."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Mapping, Protocol, Sequence

from kernelsearch.db import errors as dberr
from kernelsearch.db.checks import axes_key
from kernelsearch.kernels.undeclared import UndeclaredKernel

from .job_policy import SubmitLimits, module_refusal, submit_bounds

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import ServiceStore
    from kernelsearch.db.views import JobView
    from kernelsearch.kernels.capture import Capture


# How an undeclared kernel's call comes to be stored: the end of every "no stored call" message.
CALLS_STORED_BY = ("a process calling it under @kernelsearch.autotune stores one, with the job it "
                   "queues (KS_AUTOTUNE_FALLBACK=first or nearest) or with the config it tuned "
                   "and shared (the default), where the workers trust its module (KS_JOB_MODULES)")


class QueueLimits(SubmitLimits, Protocol):
    """The server's settings that only its routes read (the server's `Settings`)."""

    @property
    def helion_failed_retry_s(self) -> float: ...
    @property
    def search_queue_share(self) -> float: ...


class JobRefused(ValueError):
    """A job the queue does not take: 422 (a field or a limit), 429 (the queue is full)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def accept_job(store: ServiceStore, settings: SubmitLimits, k: Any,
               cases: Sequence[Mapping[str, Any]] | Literal["all"], n_trials: int,
               sampler: str | None = None, timeout_s: float | None = None,
               capture: Mapping[str, Any] | None = None) -> tuple[JobView, bool]:
    """Queue a job of kernel `k` (a KernelDef) once it passes every rule; the job and whether an
    identical one was already queued or running (then nothing is added)."""
    if n_trials > settings.max_trials_per_job:
        raise JobRefused(f"n_trials: at most {settings.max_trials_per_job} per job "
                         f"(KS_MAX_TRIALS_PER_JOB), got {n_trials}")
    if cases == "all" and isinstance(k, UndeclaredKernel):
        raise JobRefused(f"cases: {k.name} is an undeclared kernel: it has no suite cases; give "
                         f"one case of its keys{_captured_text(k, store)}")
    if cases == "all":
        valid = [dict(c.axes) for c in k.cases]
    else:
        if not cases:
            raise JobRefused('cases: give at least one case, or "all"')
        valid = []
        for i, axes in enumerate(cases):
            try:
                valid.append(k.validate_axes(dict(axes), strict=True))
            except ValueError as exc:
                raise JobRefused(f"cases[{i}]: {exc}") from None
        valid = list({tuple(sorted(c.items())): c for c in valid}.values())
    if len(valid) > settings.max_cases_per_job:
        raise JobRefused(f"cases: at most {settings.max_cases_per_job} per job "
                         f"(KS_MAX_CASES_PER_JOB), got {len(valid)}")
    cap = dict(capture) if capture is not None else None
    if cap is None and isinstance(k, UndeclaredKernel):
        cap = _stored_capture(k, valid, store)
    if cap is not None:
        _check_capture(k, cap, valid, settings)
    sampler = sampler or "tpe"
    known = _samplers()
    if known and sampler not in known:
        raise JobRefused(f"sampler: unknown {sampler!r}; known: {', '.join(known)}")
    return _queue(store, settings, k.name, valid, n_trials, sampler, timeout_s=timeout_s, capture=cap)


def accept_capture(store: ServiceStore, settings: SubmitLimits, k: Any,
                   capture: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Keep a call of undeclared kernel `k` that a user's process tuned itself (no job), once it
    passes what a job's capture passes (a module the workers trust, the definition, this
    service's bounds), so a later search of its key has a call to run: (its case, whether it is
    new)."""
    cap = dict(capture)
    parsed, axes = _check_capture(k, cap, None, settings)
    return axes, store.save_capture(k.name, axes, cap, parsed.digest)


def accept_helion_job(store: ServiceStore, settings: QueueLimits, key: str,
                      capture: Mapping[str, Any]) -> tuple[JobView, bool]:
    """Queue a worker's tuning of a Helion cache miss from its call's capture (one per key: a
    key whose job failed less than KS_HELION_FAILED_RETRY_S ago answers that job)."""
    from .helion_job import SAMPLER, check_job, parse_job

    try:
        job = parse_job(dict(capture))
    except ValueError as exc:
        raise JobRefused(str(exc)) from None
    if job.key != key:
        raise JobRefused(f"capture.key: {job.key} is not the job's key {key}")
    refused = check_job(job, settings)
    if refused is not None:
        raise JobRefused(refused)
    try:
        return _queue(store, settings, job.job_kernel, [job.case()], 1, SAMPLER,
                      capture=job.as_json(), failed_backoff_s=settings.helion_failed_retry_s)
    except ValueError as exc:
        raise JobRefused(f"capture: {exc}") from None


def search_share(store: ServiceStore, settings: QueueLimits) -> int:
    """How many new jobs one search request may queue: KS_SEARCH_QUEUE_SHARE of the queue's
    remaining room, at least one, so that one request never fills the queue every user's jobs
    wait in. JobRefused (429) when the queue is full."""
    room = settings.max_queued_jobs - store.count_jobs(status="queued")
    if room <= 0:
        raise JobRefused(f"the queue is full ({settings.max_queued_jobs} queued jobs, "
                         f"KS_MAX_QUEUED_JOBS)", status=429)
    return max(1, int(room * settings.search_queue_share))


def untrusted_kernels(store: ServiceStore, settings: SubmitLimits,
                      names: Sequence[str]) -> dict[str, str]:
    """The undeclared kernels among `names` whose module the workers do not import
    (KS_JOB_MODULES): kernel name -> why, naming the module."""
    defs = store.kernel_definitions()
    return {n: why for n in names if n in defs
            and (why := module_refusal(str(defs[n].get("module", "")), settings)) is not None}


def _queue(store: ServiceStore, settings: SubmitLimits, kernel: str, cases: list[dict[str, Any]],
           n_trials: int, sampler: str, **kw: Any) -> tuple[JobView, bool]:
    try:
        return store.queue_job(kernel, cases, n_trials, sampler, max_queued=settings.max_queued_jobs,
                               **kw)
    except dberr.Conflict as exc:
        raise JobRefused(str(exc), status=429) from None


def _captured_text(k: UndeclaredKernel, store: ServiceStore) -> str:
    """The cases of `k` a job can tune (those with a stored call), as the end of a message."""
    cases = [", ".join(f"{a}={v}" for a, v in sorted(axes.items()))
             for axes, _ in store.kernel_captures(k.name)]
    return ("; the cases with a stored call: " + "; ".join(cases[:10])) if cases else \
        "; no call of it is stored yet"


def _stored_capture(k: UndeclaredKernel, cases: list[dict[str, Any]],
                    store: ServiceStore) -> dict[str, Any]:
    """The call an undeclared kernel's job without one tunes on: the one stored with an earlier
    job of its case (it has no inputs of its own); refused saying why when there is none."""
    if len(cases) != 1:
        raise JobRefused(f"cases: {k.name} is an undeclared kernel: a job tunes one case, on a "
                         f"call of it; got {len(cases)} cases")
    stored = {axes_key(axes): cap for axes, cap in store.kernel_captures(k.name)}
    got = stored.get(axes_key(cases[0]))
    if got is None:
        raise JobRefused(f"cases[0]: {k.name} is an undeclared kernel and no call of it for this "
                         f"case is stored to tune on ({CALLS_STORED_BY}){_captured_text(k, store)}")
    return got


def _check_capture(k: Any, capture: dict[str, Any], cases: list[dict[str, Any]] | None,
                   settings: SubmitLimits) -> tuple[Capture, dict[str, Any]]:
    """A capture belongs to an undeclared kernel's job of the one case its call has (`cases`;
    None: a call kept without a job), of a module the workers trust, within the bounds of what
    a worker runs: the parsed capture and its case."""
    from kernelsearch.kernels.capture import Capture, CaptureError

    if not isinstance(k, UndeclaredKernel):
        raise JobRefused(f"capture: {k.name} is a declared kernel; only an undeclared kernel's "
                         f"job carries a capture")
    refused = module_refusal(k.definition.module, settings)
    if refused is not None:
        raise JobRefused(f"kernel: {refused}")
    try:
        cap = Capture.from_json(capture)
        cap.check_against(k.definition)
        cap.check_bounds(submit_bounds(settings), key=k.definition.key)
    except CaptureError as exc:
        raise JobRefused(str(exc)) from None
    axes = cap.case_axes(k.definition)
    try:
        case = k.validate_axes(axes) if axes is not None else None
    except ValueError as exc:
        raise JobRefused(f"capture: {exc}") from None
    if cases is not None and (len(cases) != 1 or case != cases[0]):
        raise JobRefused(f"cases: a job with a capture tunes the captured call's case ({axes}), "
                         f"got {cases}")
    if case is None:
        raise JobRefused(f"capture: the call gives no case of {k.name}'s key")
    return cap, case


def _samplers() -> tuple[str, ...]:
    try:
        from kernelsearch.search_space.tuner import SAMPLERS
    except ImportError:
        return ()
    return tuple(SAMPLERS)
