"""The project's tables, all prefixed `ks_` so they share a database with Optuna's own.

Only the repositories in `db.repos` read and write these; other layers see the plain views of
`db.views`.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from .checks import KERNEL_NAME_CHARS, kernel_key
from .statuses import JOB_KINDS, JOB_STATUSES, JobStatus, RecordOrigin, WinnerOrigin

# Stable constraint names: Alembic's batch mode on SQLite and later migrations need them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

TABLE_PREFIX = "ks_"
# triton-do-bench: a user process tuned the record with triton.testing.do_bench, as triton.autotune does.
TIMING_METHODS = ("cupti", "interpreter-wallclock", "triton-do-bench")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both databases (SQLite stores naive UTC text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(), list[Any]: JSON()}


class Device(Base):
    """A device as `torch.cuda.get_device_name()` names it (records are keyed by the name)."""

    __tablename__ = "ks_devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    multiprocessors: Mapped[int | None] = mapped_column(Integer)
    cuda_version: Mapped[str | None] = mapped_column(String(32))
    driver_version: Mapped[str | None] = mapped_column(String(32))
    interpreter: Mapped[bool] = mapped_column(Boolean, default=False)
    info: Mapped[dict[str, Any] | None]
    first_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class Kernel(Base):
    """A kernel by its full name (`module.qualname` for an undeclared one, any script and up to
    checks.KERNEL_NAME_CHARS long), found by `name_key` (checks.kernel_key of the name): an index
    over the name itself would refuse a long one on PostgreSQL."""

    __tablename__ = "ks_kernels"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(KERNEL_NAME_CHARS))
    name_key: Mapped[str] = mapped_column(String(64), unique=True)
    # An undeclared kernel's definition (kernels.undeclared.Definition as JSON): what the service
    # lists, gates and serves it by without importing the user's module. None: a declared kernel.
    definition: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def kernel_named(name: str) -> Any:
    """The WHERE clause for the kernel of this full name (through its indexed key)."""
    return Kernel.name_key == kernel_key(name)


class Case(Base):
    """A workload case of a kernel, identified by its axes (suite or custom).

    `axes_key` is the canonical JSON of the axes (sorted keys), so equality is a string match.
    `work` (bytes the case moves) is what "nearest case" is measured in.
    """

    __tablename__ = "ks_cases"
    __table_args__ = (UniqueConstraint("kernel_id", "axes_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("ks_kernels.id", ondelete="CASCADE"))
    axes: Mapped[dict[str, Any]]
    axes_key: Mapped[str] = mapped_column(String(500))
    work: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """A tuning job in the queue; a worker claims it with a lease renewed by heartbeats."""

    __tablename__ = "ks_jobs"
    __table_args__ = (
        CheckConstraint(f"status IN ({', '.join(repr(s) for s in JOB_STATUSES)})", name="status"),
        CheckConstraint(f"kind IN ({', '.join(repr(k) for k in JOB_KINDS)})", name="kind"),
        Index("ix_ks_jobs_status_id", "status", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("ks_kernels.id"))
    cases: Mapped[list[Any]]
    n_trials: Mapped[int] = mapped_column(Integer)
    # statuses.JobKind: what the job runs, the worker's dispatch.
    kind: Mapped[str] = mapped_column(String(16))
    sampler: Mapped[str] = mapped_column(String(32))
    timeout_s: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value)
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    device: Mapped[str | None] = mapped_column(String(200))
    best: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Claims that ended with the holder silent past its lease (taken over): capped per job.
    lost_claims: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    current_case: Mapped[dict[str, Any] | None]
    # An undeclared kernel's job: the call it tunes on (kernels.capture.Capture as JSON).
    capture: Mapped[dict[str, Any] | None]


class CallCapture(Base):
    """A call of an undeclared kernel that a user's process met and tuned itself (no job): kept
    so a search of its key (`kernelsearch search --from-captures`) has a call to run, as a
    job's `capture` is. One row per distinct call (its digest) of a kernel."""

    __tablename__ = "ks_captures"
    __table_args__ = (UniqueConstraint("kernel_id", "digest"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("ks_kernels.id", ondelete="CASCADE"),
                                           index=True)
    axes: Mapped[dict[str, Any]]
    axes_key: Mapped[str] = mapped_column(String(500))
    digest: Mapped[str] = mapped_column(String(64))
    capture: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Record(Base):
    """A tuned result for (kernel, case, device). At most one is current per key; the others are
    history, each pointing at the record that superseded it.

    `job_id` is a plain number, not a foreign key: imported records keep the job id of the
    database that tuned them. `fingerprint` hashes the measured content so re-imports are no-ops.
    """

    __tablename__ = "ks_records"
    __table_args__ = (
        Index(
            "uq_ks_records_current",
            "case_id",
            "device_id",
            unique=True,
            sqlite_where=text("is_current = 1"),
            postgresql_where=text("is_current"),
        ),
        Index("ix_ks_records_kernel_device", "kernel_id", "device_id", "is_current"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("ks_kernels.id"))
    case_id: Mapped[int] = mapped_column(ForeignKey("ks_cases.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("ks_devices.id"))
    device_info: Mapped[dict[str, Any] | None]
    torch_version: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str] = mapped_column(String(64))
    source_hash: Mapped[str] = mapped_column(String(128))
    config: Mapped[dict[str, Any]]
    latency_median_us: Mapped[float] = mapped_column(Float)
    latency_min_us: Mapped[float] = mapped_column(Float)
    latency_max_us: Mapped[float] = mapped_column(Float)
    latency_iqr_us: Mapped[float] = mapped_column(Float)
    timing_method: Mapped[str] = mapped_column(String(32))
    roofline_pct: Mapped[float | None] = mapped_column(Float)
    speedup_eager: Mapped[float | None] = mapped_column(Float)
    speedup_compile: Mapped[float | None] = mapped_column(Float)
    # The PyTorch references' median latencies measured with the record (same timing method):
    # what the speedups are ratios of, shipped with the record so they stay computable.
    eager_latency_us: Mapped[float | None] = mapped_column(Float)
    compile_latency_us: Mapped[float | None] = mapped_column(Float)
    rel_error: Mapped[float] = mapped_column(Float)
    n_trials: Mapped[int] = mapped_column(Integer)
    n_failed: Mapped[int] = mapped_column(Integer)
    # Every config measured with this record ({config_key: median us}), so a decorator whose
    # config list grew measures only the new ones.
    config_timings: Mapped[dict[str, Any] | None]
    study_name: Mapped[str | None] = mapped_column(String(300))
    job_id: Mapped[int | None] = mapped_column(Integer)
    tuned_at: Mapped[datetime]
    # Provenance (statuses.RECORD_ORIGINS): an upload never supersedes another origin's record.
    # `uploaded_by` is the writer token's name or "anonymous", `uploaded_from` the client's host.
    origin: Mapped[str] = mapped_column(String(16), server_default=RecordOrigin.WORKER.value)
    uploaded_by: Mapped[str | None] = mapped_column(String(200))
    uploaded_from: Mapped[str | None] = mapped_column(String(200))
    # statuses.WINNER_ORIGINS: the list's config or a searched one, and the searched one's gain.
    winner_origin: Mapped[str] = mapped_column(String(16), server_default=WinnerOrigin.LIST.value)
    gain_vs_list: Mapped[float | None] = mapped_column(Float)
    # A searched winner's evidence: its gain's lower confidence bound, and the edge calls of the
    # key the strict gate ran it on (None: no strict gate ran).
    gain_low: Mapped[float | None] = mapped_column(Float)
    gate_edges: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    is_current: Mapped[bool] = mapped_column(Boolean)
    superseded_at: Mapped[datetime | None]
    superseded_by: Mapped[int | None] = mapped_column(ForeignKey("ks_records.id"))
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)


class TrialSummary(Base):
    """One Optuna trial's outcome, keyed by the study's name and Optuna's trial number."""

    __tablename__ = "ks_trials"
    __table_args__ = (
        UniqueConstraint("study_name", "trial_number"),
        Index("ix_ks_trials_case_device", "case_id", "device_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_name: Mapped[str] = mapped_column(String(300))
    trial_number: Mapped[int] = mapped_column(Integer)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("ks_kernels.id"))
    case_id: Mapped[int] = mapped_column(ForeignKey("ks_cases.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("ks_devices.id"))
    state: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]]
    latency_median_us: Mapped[float | None] = mapped_column(Float)
    failure_kind: Mapped[str | None] = mapped_column(String(32))
    message: Mapped[str | None] = mapped_column(Text)
    extra: Mapped[dict[str, Any] | None]
    # The tuning job whose study ran the trial (a plain number, like Record.job_id).
    job_id: Mapped[int | None] = mapped_column(Integer, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Counter(Base):
    """Named counters; `records` is bumped with every change to records (cache invalidation).

    Locking a counter's row also serialises the writers that must not interleave on PostgreSQL.
    """

    __tablename__ = "ks_counters"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class StudyClaim(Base):
    """Which worker tunes a study now: the study, not the job, is the unit of work a worker holds,
    so two jobs asking for the same case never spend its trials twice. Renewed with the job's
    heartbeat; a claim older than the lease may be taken over."""

    __tablename__ = "ks_study_claims"

    study_name: Mapped[str] = mapped_column(String(300), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    job_id: Mapped[int | None] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime]
    # The fencing token (the job's attempt number) of the lease the claim was taken under.
    job_attempt: Mapped[int | None] = mapped_column(Integer)


class HelionEntry(Base):
    """One entry of Helion's autotune cache (`kernelsearch.helion`), under Helion's own cache key.

    Kept apart from `Record`: Helion's entry carries no latency, error or versions to fill a
    record with, and its config (lists per block) is no flat config of a declared kernel. `data`
    is the exact JSON text Helion stored, so a read gives back those bytes; the other columns are
    read out of it for listing and the dashboard. `checked_by` says which check the config passed
    before it was stored (Helion compares each candidate's output with its default config's)."""

    __tablename__ = "ks_helion_entries"
    __table_args__ = (Index("ix_ks_helion_entries_updated_at", "updated_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    cache_key: Mapped[str] = mapped_column(String(64), unique=True)
    kernel: Mapped[str] = mapped_column(String(300), index=True)
    hardware: Mapped[str] = mapped_column(String(200))
    specialization_key: Mapped[str] = mapped_column(Text)
    axes: Mapped[dict[str, Any]]
    config: Mapped[dict[str, Any]]
    data: Mapped[str] = mapped_column(Text)
    kernel_source_hash: Mapped[str] = mapped_column(String(128))
    runtime_name: Mapped[str] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(64))
    key_type: Mapped[str] = mapped_column(String(64))
    checked_by: Mapped[str] = mapped_column(String(64))
    # Provenance (statuses.RecordOrigin): an upload never replaces a worker's entry.
    origin: Mapped[str] = mapped_column(String(16), server_default=RecordOrigin.UPLOAD.value)
    uploaded_by: Mapped[str | None] = mapped_column(String(200))
    uploaded_from: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ArtifactBlob(Base):
    """One compiled file (a cubin, its metadata json, its IRs), stored once under its sha256.

    Why a bytea/blob column and not PostgreSQL large objects: a compile group is kilobytes to a
    few MB (far under bytea's 1 GB), a row is deleted with its transaction and its references
    (large objects leak unless lo_unlink'ed or vacuumlo'ed), pg_dump and `kernelsearch db
    export` carry it like any column, and SQLite stores it the same way, one code path. Large
    objects pay only for streaming files of hundreds of MB, which no compiled kernel is."""

    __tablename__ = "ks_artifact_blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ArtifactSet(Base):
    """One Triton compile group (what `triton.compiler.compile` writes under one cache key) of the
    config a record serves, tied to that record (withdrawn with it: ON DELETE CASCADE) and to the
    compile fingerprint it loads under: Triton's cache key (source, options, target, Triton
    build) and `env_fingerprint`, the sha256 of what that key leaves out (compute capability,
    CUDA driver, ptxas, Triton build; `env` keeps the fields)."""

    __tablename__ = "ks_artifact_sets"
    __table_args__ = (UniqueConstraint("record_id", "cache_key", "env_fingerprint"),
                      UniqueConstraint("helion_entry_id", "cache_key", "env_fingerprint"),
                      CheckConstraint("(record_id IS NULL) <> (helion_entry_id IS NULL)",
                                      name="one_owner"),
                      Index("ix_ks_artifact_sets_env_fingerprint", "env_fingerprint"),
                      Index("ix_ks_artifact_sets_cache_key", "cache_key"))

    id: Mapped[int] = mapped_column(primary_key=True)
    # Exactly one owner: the record whose config it compiles, or the Helion entry whose config
    # Helion generated the kernel for (its Triton compile group); withdrawn with either.
    record_id: Mapped[int | None] = mapped_column(ForeignKey("ks_records.id", ondelete="CASCADE"))
    helion_entry_id: Mapped[int | None] = mapped_column(
        ForeignKey("ks_helion_entries.id", ondelete="CASCADE"), index=True)
    cache_key: Mapped[str] = mapped_column(String(64))
    env_fingerprint: Mapped[str] = mapped_column(String(64))
    env: Mapped[dict[str, Any]]
    # The group's metadata file name (`<kernel>.json`): the group Triton looks up by.
    group: Mapped[str] = mapped_column(String(200))
    origin: Mapped[str] = mapped_column(String(16))
    uploaded_by: Mapped[str | None] = mapped_column(String(200))
    uploaded_from: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ArtifactFile(Base):
    """A file of an artifact set: its name in the group and the blob holding its bytes."""

    __tablename__ = "ks_artifact_files"

    set_id: Mapped[int] = mapped_column(ForeignKey("ks_artifact_sets.id", ondelete="CASCADE"),
                                        primary_key=True)
    filename: Mapped[str] = mapped_column(String(200), primary_key=True)
    sha256: Mapped[str] = mapped_column(ForeignKey("ks_artifact_blobs.sha256"), index=True)
