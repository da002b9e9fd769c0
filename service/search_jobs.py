"""Search jobs: a worker searches one key of an undeclared kernel beyond its config list, from
the key's stored capture.

A search job (JobKind.SEARCH) is a capture job whose sampler is `SEARCH` (queued by `kernelsearch search
--from-captures` or `POST /v1/search`, one per key a program's captures have met). The worker
runs it in a disposable child (service.job_child): the per-key study in the store, the strict
gate, the interleaved re-measure (search_space.captured_search). Its record, through the one
acceptance gate, says where the winner came from: the searched config with its re-measured gain
over the list's best when it beat it with confidence, else the list's best (gain 1).
"""
from __future__ import annotations

import math
import socket
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kernelsearch.db.statuses import SEARCH_SAMPLER, JobStatus, RecordOrigin, WinnerOrigin
from kernelsearch.db.views import Accepted, JobView, RecordIn

if TYPE_CHECKING:
    from kernelsearch.kernels.spec import KernelDef

from kernelsearch.search_space.job_acceptance import CALLS_STORED_BY
from .settings import Settings

SEARCH = SEARCH_SAMPLER  # the job's sampler: what makes a capture job a JobKind.SEARCH job


def study_of(kernel: str, axes: Mapping[str, Any], device: str) -> str:
    """The key's search study (apart from its tuning study, whose space is the list)."""
    from kernelsearch.search_space.tuner import STUDY_NAME_CHARS, study_name

    return study_name(kernel, axes, device).replace("ks/", "ks-search/", 1)[:STUDY_NAME_CHARS]


def queue_searches(store: Any, settings: Settings, kernel: str | None = None, *,
                   max_new: int | None = None) -> list[tuple[JobView, bool]]:
    """A search job for every key whose call a kernel's jobs stored (every undeclared kernel's,
    or `kernel`'s): (job, new) each, an identical job already queued or running answered as is;
    none past `max_new` new jobs (the keys after are left out). ValueError naming `kernel` when
    it is no undeclared kernel the store knows, or has no stored call."""
    known = sorted(store.kernel_definitions())
    if kernel and kernel not in known:
        raise ValueError(f"kernel: {kernel!r} is no undeclared kernel of this store; known: "
                         f"{', '.join(known[:20]) or 'none'}")
    names = [kernel] if kernel else known
    out: list[tuple[JobView, bool]] = []
    for name in names:
        calls = store.kernel_captures(name)
        if kernel and not calls:
            raise ValueError(f"kernel: {name} has no stored call to search from "
                             f"({CALLS_STORED_BY})")
        for axes, capture in calls:
            if max_new is not None and sum(new for _, new in out) >= max_new:
                return out
            job, existing = store.queue_job(name, [axes], settings.search_trials, SEARCH,
                                            settings.search_seconds * 2, settings.max_queued_jobs,
                                            capture)
            out.append((job, not existing))
    return out


def _search_child(args: dict[str, Any]) -> dict[str, Any]:
    from kernelsearch.search_space.captured_search import search_captured

    return search_captured(**args)


def search_record(kdef: KernelDef, axes: Mapping[str, Any], out: Mapping[str, Any], *,
                  study_name: str, job_id: int | None) -> Accepted[RecordIn]:
    """The record of a search's outcome as the gate accepted it (RecordRejected otherwise): the
    searched winner with the list's configs' timings and its gain, or the list's best with the
    list's timings only. Configs keyed as the kernel's pruner ran them on the call: the
    definition knows those the pruner made (`Definition.pruned`), as a user's own tuning does."""
    from kernelsearch.kernels import registry
    from kernelsearch.kernels.capture import CapturedKernel, captured_kernel
    from kernelsearch.kernels.undeclared import UndeclaredKernel, kernel_def
    from kernelsearch.search_space.acceptance import accepted
    from kernelsearch.search_space.records import measured_record

    grown = kdef.definition.with_pruned(out.get("pruned") or ()) \
        if isinstance(kdef, UndeclaredKernel) else None
    if grown is not None and grown is not kdef.definition:  # type: ignore[attr-defined]
        kdef = (captured_kernel(grown, kdef.capture, tuner=kdef.tuner)
                if isinstance(kdef, CapturedKernel) else kernel_def(grown))
        registry.register(kdef, replace=True)  # the gate knows a kernel by its registered name

    timings: dict[str, float | None] = dict(out["timings"])
    listed = list(out["listed"])
    winner = out["winner"]
    searched = out["winner_origin"] == WinnerOrigin.SEARCH
    kept = {k: timings.get(k) for k in listed}
    if searched:
        kept[winner] = timings[winner]
    value = float(timings[winner])  # type: ignore[arg-type]
    versions = out.get("versions") or {}
    n_failed = sum(1 for t in timings.values() if t is None)
    verdict = out.get("verdict")
    err = float(out.get("gate_rel_error") or 0.0)  # the strict gate's worst, over its draws
    return accepted(measured_record(
        kdef, axes, out["device"], config=dict(out["configs"][winner]),
        device_info=out.get("device_info"), torch_version=str(versions.get("torch", "")),
        triton_version=str(versions.get("triton", "")), latency_median_us=value, latency_min_us=value,
        latency_max_us=value, latency_iqr_us=0.0, timing_method=out["timing_method"],
        rel_error=err if math.isfinite(err) else 0.0,
        n_trials=len(timings), n_failed=n_failed, config_timings=kept, study_name=study_name,
        job_id=job_id, tuned_at=datetime.now(timezone.utc), origin=RecordOrigin.WORKER.value,
        winner_origin=WinnerOrigin.SEARCH.value if searched else WinnerOrigin.LIST.value,
        gain_vs_list=float(out["gain"]) if searched else (1.0 if verdict is not None else None),
        gain_low=float(out["gain_low"]) if searched and out.get("gain_low") is not None else None,
        gate_edges=int(out["gate_edges"]) if searched and out.get("gate_edges") is not None
        else None))


def _edges(store: Any, settings: Settings, kdef: Any, job: Any, axes: Mapping[str, Any],
           device_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The key's edges the strict gate checks a searched config on besides the job's call:
    the smallest and largest other stored call sharing the key, within this worker's capture
    bounds (KS_CAPTURE_MAX_BYTES, KS_CAPTURE_MAX_PROGRAMS) on the trial child's device."""
    from kernelsearch.kernels.capture import key_edges

    from kernelsearch.search_space.job_policy import worker_bounds

    if not isinstance(job.capture, dict):
        return []
    return key_edges(job.capture, store.key_captures(job.kernel, dict(axes)),
                     kdef.definition, worker_bounds(settings, device_info))


def run_search_job(store: Any, settings: Settings, job: Any, held: Any, *, owner: str,
                   stop: Callable[[], bool], limit_s: float, device_info: Mapping[str, Any],
                   run: Callable[..., Any] | None = None) -> tuple[JobStatus | None, str | None]:
    """Run a search job whose kernel the worker registered from the job's capture (Worker.
    _captured_kernel): the child's search, then its record through the gate, fenced by `held`.
    `device_info` is the trial child's report: the worker never probes the GPU itself (a CUDA
    context it holds costs the device memory, and a probe poisons what it forks). `run` stands
    in for service.job_child.run_in_child (a test runs it in process)."""
    from kernelsearch.kernels import get_kernel
    from kernelsearch.search_space.acceptance import RecordRejected

    from .job_child import JobChildFailed, JobChildStopped, run_in_child

    kdef = get_kernel(job.kernel)
    axes = dict(job.cases[0])
    device = str(device_info["name"])
    study = study_of(job.kernel, axes, device)
    current = [r for r in store.list_records(job.kernel, device) if dict(r.axes) == axes
               and r.source_hash == kdef.source_hash]
    args = {"definition": kdef.definition.as_json(), "capture": job.capture,  # type: ignore[attr-defined]
            "storage": settings.database_url, "study_name": study,
            "budget": {"n_trials": job.n_trials, "timeout_s": settings.search_seconds},
            "sampler": settings.search_sampler,
            "listed_timings": dict(current[0].config_timings or {}) if current else None,
            "edges": _edges(store, settings, kdef, job, axes, device_info)}
    store.update_job_progress(held, trials_done=0, device=device,
                              current_case={"index": 0, "axes": axes})
    try:
        out = (run or run_in_child)(_search_child, args, stop=stop, limit_s=limit_s)
    except JobChildStopped as exc:
        return (JobStatus.FAILED, f"search: {exc}") if exc.timed_out else (None, None)
    except JobChildFailed as exc:
        return JobStatus.FAILED, f"search: the search's child {exc}"
    if out.get("winner") is None:
        return JobStatus.FAILED, "search: no listed config ran on this key"
    try:
        ok = search_record(kdef, axes, out, study_name=study, job_id=job.id)
    except RecordRejected as exc:
        return JobStatus.FAILED, f"search: the record was refused by the gate: {exc}"
    store.under_lease(held).upsert_best(ok)
    rec = ok.value
    verdict = out.get("verdict") or {}
    store.update_job_progress(held, trials_done=int(out["evaluated"]), best={"cases": [{
        "axes": axes, "best_latency_us": rec.latency_median_us, "config": rec.config,
        "winner_origin": rec.winner_origin, "gain_vs_list": rec.gain_vs_list,
        "speedup_remeasured": verdict.get("speedup"), "refused": len(out.get("refused") or {}),
        "trials_done": int(out["evaluated"]), "trials_to_best": out.get("trials_to_best"),
        "host": socket.gethostname(), "worker": owner}]})
    return JobStatus.SUCCEEDED, None


__all__ = ["SEARCH", "queue_searches", "run_search_job", "search_record", "study_of"]
