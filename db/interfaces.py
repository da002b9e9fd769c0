"""The storage seams, one per concern, the way Optuna keeps `BaseStorage` apart from `BaseHeartbeat`.

A consumer names the narrowest protocol it needs (the tuner does not see the job queue, the
lookup path does not see imports); each repository of `db.repos` implements its own and the
SQL `Store` combines them all, and the storage contract
suite runs against every backend through them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from .statuses import JobStatus
    from .views import (Accepted, ArtifactSetView, HelionEntryIn, HelionEntryView, ImportReport,
                        JobView, RecordIn, RecordView, Withdrawal)
    from .wire import EntryCheck


@dataclass(frozen=True)
class Lease:
    """One claim of a job by one worker. `token` is the fencing token: the job's attempt number,
    which every claim increments, so a worker whose lease lapsed and was claimed again holds an
    older token than the job row, and each of its writes (checked against the token in the same
    transaction) is refused with LeaseLost."""

    job_id: int
    owner: str
    token: int

    @classmethod
    def of(cls, job: JobView) -> Lease:
        """The lease `claim_job` just gave (the claimed job's view)."""
        if job.owner is None:
            raise ValueError(f"job: job {job.id} is not claimed")
        return cls(job.id, job.owner, job.attempts)


@runtime_checkable
class Health(Protocol):
    """Reachability, and giving the connections back."""

    def ping(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class DeviceRegistry(Protocol):
    """The devices records were tuned on."""

    def ensure_device(self, info: dict[str, Any]) -> int: ...

    def list_devices(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class JobQueue(Protocol):
    """Background tuning jobs and their leases. Every write on a claimed job takes its Lease and
    raises LeaseLost, changing nothing, when the lease is no longer held."""

    def create_job(self, kernel: str, cases: list[dict[str, int]], n_trials: int, sampler: str,
                   timeout_s: float | None = None, max_queued: int | None = None,
                   capture: dict[str, Any] | None = None) -> JobView: ...

    def queue_job(self, kernel: str, cases: list[dict[str, int]], n_trials: int, sampler: str,
                  timeout_s: float | None = None, max_queued: int | None = None,
                  capture: dict[str, Any] | None = None,
                  failed_backoff_s: float | None = None) -> tuple[JobView, bool]: ...

    def get_job(self, job_id: int) -> JobView | None: ...

    def list_jobs(self, status: str | None = None, limit: int = 100) -> list[JobView]: ...

    def count_jobs(self, status: str | None = None) -> int: ...

    def page_jobs(self, status: str | None = None, kernel: str | None = None, *,
                  offset: int = 0, limit: int = 50) -> tuple[list[JobView], int]: ...

    def claim_job(self, owner: str, lease_seconds: float, max_claims: int = ...) -> JobView | None: ...

    def heartbeat(self, lease: Lease) -> None: ...

    def release_job(self, lease: Lease) -> None: ...

    def update_job_progress(self, lease: Lease, *, trials_done: int,
                            device: str | None = None, best: dict[str, Any] | None = None,
                            current_case: dict[str, Any] | None = None) -> None: ...

    def finish_job(self, lease: Lease, status: JobStatus, error: str | None = None) -> None: ...

    def under_lease(self, lease: Lease) -> Self: ...

    def cancel_job(self, job_id: int) -> JobView | None: ...

    def keep_cancelled_best(self, lease: Lease, *, trials_done: int,
                            best: dict[str, Any]) -> bool: ...


@runtime_checkable
class StudyClaims(Protocol):
    """One tuner per Optuna study at a time, across workers; a claim is held under a job's lease."""

    def claim_study(self, study_name: str, lease: Lease, lease_seconds: float) -> str | None: ...

    def release_study(self, study_name: str, lease: Lease) -> None: ...

    def check_study_claim(self, session: Any, study_name: str, lease: Lease) -> None: ...


@runtime_checkable
class RecordRepository(Protocol):
    """Best records per (kernel, case, device), with their history and the nearest-case lookup."""

    def upsert_best(self, rec: Accepted[RecordIn]) -> tuple[RecordView, bool]: ...

    def find_best(self, kernel: str, device: str, axes: dict[str, Any],
                  distance: Callable[[dict[str, Any], float], float],
                  ) -> tuple[RecordView, str] | None: ...

    def list_records(self, kernel: str | None = None, device: str | None = None,
                     include_history: bool = False) -> list[RecordView]: ...

    def record_history(self, kernel: str, device: str, axes: dict[str, int]) -> list[RecordView]: ...

    def records_version(self) -> int: ...

    def has_records(self, kernel: str | None = None) -> bool: ...


@runtime_checkable
class TrialLog(Protocol):
    """Per-trial summaries of every study, for the dashboard and the failed-trial report."""

    def add_trial_summary(self, study_name: str, kernel: str, device: str, axes: dict[str, int],
                          trial_number: int, state: str, config: dict[str, Any],
                          latency_median_us: float | None, failure_kind: str | None,
                          message: str | None, extra: dict[str, Any] | None = None,
                          job_id: int | None = None) -> None: ...

    def trial_numbers(self, study_name: str) -> set[int]: ...

    def count_job_trials(self) -> int: ...

    def trial_summaries(self, kernel: str, device: str, axes: dict[str, int]) -> list[dict[str, Any]]: ...

    def job_trials(self, job_id: int) -> list[dict[str, Any]]: ...

    def optuna_studies(self, names: list[str]) -> set[str]: ...


@runtime_checkable
class RecordTransfer(Protocol):
    """Records files out and in (the wire format lives with it), and a record withdrawn."""

    def export_records(self, kernel: str | None = None, device: str | None = None,
                       include_history: bool = False) -> dict[str, Any]: ...

    def import_records(self, doc: dict[str, Any], *, check: EntryCheck,
                       keep_going: bool = False) -> ImportReport: ...

    def withdraw_record(self, record_id: int) -> Withdrawal: ...

    def reset_study(self, study_name: str) -> bool: ...


@runtime_checkable
class KernelDefinitions(Protocol):
    """Undeclared kernels' definitions, as the decorator sent them."""

    def save_definition(self, name: str, definition: dict[str, Any]) -> bool: ...

    def kernel_definitions(self) -> dict[str, dict[str, Any]]: ...

    def save_capture(self, kernel: str, axes: dict[str, Any], capture: dict[str, Any],
                     digest: str) -> bool: ...

    def kernel_captures(self, kernel: str, limit: int = 1000) -> list[tuple[dict[str, Any], dict[str, Any]]]: ...

    def key_captures(self, kernel: str, axes: dict[str, Any], limit: int = 1000) -> list[dict[str, Any]]: ...


@runtime_checkable
class HelionEntries(Protocol):
    """Helion's autotune cache entries under Helion's cache keys (`kernelsearch.helion`)."""

    def put_helion_entry(self, entry: Accepted[HelionEntryIn]) -> HelionEntryView: ...

    def get_helion_entry(self, cache_key: str) -> HelionEntryView | None: ...

    def list_helion_entries(self, limit: int = 100, *, kernel: str | None = None,
                            hardware: str | None = None) -> list[HelionEntryView]: ...

    def withdraw_helion_entry(self, cache_key: str) -> HelionEntryView: ...


@runtime_checkable
class Artifacts(Protocol):
    """Compiled kernels beside the records whose configs they compile (`db.repos.artifacts`)."""

    def put_artifacts(self, record_id: int, *, cache_key: str, env: Any, env_fingerprint: str,
                      group: str, files: Any, origin: str, uploaded_by: str | None = None,
                      uploaded_from: str | None = None,
                      max_bytes: int | None = None,
                      max_uploads: int | None = None) -> ArtifactSetView: ...

    def record_owner(self, record_id: int) -> tuple[str, dict[str, Any]] | None: ...

    def artifacts_of_record(self, record_id: int, env_fingerprint: str, *, after: int = 0,
                            max_bytes: int | None = None,
                            workers_only: bool = False) -> list[ArtifactSetView]: ...

    def artifacts_by_cache_key(self, cache_key: str, env_fingerprint: str, *,
                               workers_only: bool = False) -> list[ArtifactSetView]: ...

    def put_helion_artifacts(self, helion_key: str, *, cache_key: str, env: Any,
                             env_fingerprint: str, group: str, files: Any, origin: str,
                             uploaded_by: str | None = None, uploaded_from: str | None = None,
                             max_bytes: int | None = None,
                      max_uploads: int | None = None) -> ArtifactSetView: ...

    def artifacts_of_helion_entry(self, helion_key: str, env_fingerprint: str, *,
                                  max_bytes: int | None = None,
                                  workers_only: bool = False) -> list[ArtifactSetView]: ...

    def artifacts_for_device(self, device: str, env_fingerprint: str, kernels: Any = None,
                             max_bytes: int | None = None, *, after: int = 0,
                             workers_only: bool = False) -> list[ArtifactSetView]: ...

    def drop_orphan_artifact_blobs(self) -> int: ...


@runtime_checkable
class TuningStore(RecordRepository, TrialLog, DeviceRegistry, StudyClaims, Protocol):
    """What the tuner writes to: records, trials, devices, and the claim on its study."""


@runtime_checkable
class WorkerStore(TuningStore, JobQueue, Health, HelionEntries, Artifacts, Protocol):
    """What a worker needs: the queue, what the tuner writes, and Helion's entries (a Helion job
    stores one)."""


@runtime_checkable
class ServiceStore(WorkerStore, RecordTransfer, KernelDefinitions, Protocol):
    """Everything the API serves: all of the above."""
