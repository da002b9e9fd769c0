"""The facade every other layer uses: one method, one transaction, plain views out.

Concurrency rules (both SQLite and PostgreSQL):
- writes on SQLite start with `BEGIN IMMEDIATE` (see db.engine), so they are serialised;
- a job is claimed by one conditional UPDATE whose subquery takes the row `FOR UPDATE SKIP
  LOCKED` on PostgreSQL, and whose outer WHERE repeats the condition (atomic on SQLite);
- writers of records lock the `records` counter row first, so "read the current best, compare,
  replace" never interleaves; a partial unique index keeps at most one current record per key.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError,
                      field_validator, model_validator)
from sqlalchemy import Engine, and_, delete, func, or_, select, update
from sqlalchemy import case as sa_case
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.orm import Session, sessionmaker

from .engine import make_engine, retrying, translate_errors
from .errors import Conflict, ImportRejected
from .portable import dotted, first_unportable
from .models import (
    JOB_STATUSES,
    Case,
    Counter,
    Device,
    Job,
    Kernel,
    Record,
    StudyClaim,
    TrialSummary,
    utcnow,
)

EXPORT_SCHEMA = "kernelsearch.records"
# Version 2 adds each record's trials and its references' latencies; version 1 still imports.
EXPORT_VERSION = 2
IMPORT_VERSIONS = (1, 2)
TRIAL_STATES = ("complete", "fail")
EXPORT_MESSAGE_CHARS = 2000
FINISHED_STATUSES = ("succeeded", "failed", "cancelled")
_RETRIES = 6
T = TypeVar("T")


def _iso(v: Any) -> Any:
    return v.isoformat() if isinstance(v, datetime) else v


# A case axis: a size, or a category such as a dtype (strict: `true` is not 1, 1 is not "1").
AxisValue = StrictInt | StrictStr


def _check_positive(v: Any, arg: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{arg}: expected a number > 0, got {v!r}")


def axes_key(axes: dict[str, Any], *, arg: str = "axes") -> str:
    """Canonical text of a case's axes (sorted keys), the way cases are matched. Values are ints
    (sizes) or non-empty strings (categories such as a dtype)."""
    if not isinstance(axes, dict) or not axes:
        raise ValueError(f"{arg}: expected a non-empty dict of axis name -> int or str, got {axes!r}")
    for k, v in axes.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{arg}: axis names must be non-empty strings, got {k!r}")
        if isinstance(v, str):
            if not v or "\x00" in v:
                raise ValueError(f"{arg}[{k!r}]: expected a non-empty category, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{arg}[{k!r}]: expected an int or a category string, got {v!r}")
    return json.dumps(axes, sort_keys=True, separators=(",", ":"))


# ----------------------------------------------------------------------------- views


@dataclass(frozen=True)
class JobView:
    id: int
    kernel: str
    cases: list[dict[str, Any]]
    n_trials: int
    sampler: str
    timeout_s: float | None
    status: str
    trials_done: int
    device: str | None
    best: dict[str, Any] | None
    error: str | None
    owner: str | None
    heartbeat_at: datetime | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    current_case: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {k: _iso(v) for k, v in asdict(self).items()}


@dataclass(kw_only=True)
class RecordIn:
    """A tuned result to store; `work` is the bytes the case moves (for nearest-case lookups)."""

    kernel: str
    axes: dict[str, Any]
    work: float
    device: str
    torch_version: str
    triton_version: str
    source_hash: str
    config: dict[str, Any]
    latency_median_us: float
    latency_min_us: float
    latency_max_us: float
    latency_iqr_us: float
    timing_method: str
    rel_error: float
    n_trials: int
    n_failed: int = 0
    roofline_pct: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    eager_latency_us: float | None = None
    compile_latency_us: float | None = None
    study_name: str | None = None
    job_id: int | None = None
    device_info: dict[str, Any] | None = None
    tuned_at: datetime = field(default_factory=utcnow)
    # The trials of the record's study (an import carries them; the tuner stores its own).
    trials: list[TrialIn] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class TrialIn:
    """One trial of a record's study as an export carries it (Optuna's trial number)."""

    number: int
    state: str
    config: dict[str, Any]
    latency_median_us: float | None = None
    failure_kind: str | None = None
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class RecordView:
    id: int
    kernel: str
    axes: dict[str, Any]
    work: float | None
    device: str
    device_info: dict[str, Any] | None
    torch_version: str
    triton_version: str
    source_hash: str
    config: dict[str, Any]
    latency_median_us: float
    latency_min_us: float
    latency_max_us: float
    latency_iqr_us: float
    timing_method: str
    roofline_pct: float | None
    speedup_eager: float | None
    speedup_compile: float | None
    rel_error: float
    n_trials: int
    n_failed: int
    study_name: str | None
    job_id: int | None
    tuned_at: datetime
    is_current: bool
    superseded_at: datetime | None
    superseded_by: int | None = None
    eager_latency_us: float | None = None
    compile_latency_us: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: _iso(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class ImportReport:
    """added: new records stored; superseded: current records an imported one replaced;
    unchanged: entries already present (a second import of the same file is all unchanged)."""

    added: int = 0
    superseded: int = 0
    unchanged: int = 0
    trials_added: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# ----------------------------------------------------------------------------- validation


def _finite(v: float | None, name: str, *, positive: bool = False) -> float | None:
    if v is None:
        return v
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite")
    if v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}")
    return v


def _width(column: Any) -> int:
    """The declared length of a String column: PostgreSQL refuses longer text, SQLite does not."""
    return int(column.property.columns[0].type.length)


INT32_MAX = 2**31 - 1  # Integer columns on PostgreSQL
INT64_MAX = 2**63 - 1  # BigInteger columns


def _datetime_text(v: Any) -> Any:
    # Lax datetime parsing would also read a number as a Unix time.
    if not isinstance(v, (str, datetime)):
        raise ValueError(f"expected an ISO 8601 date-time text, got {type(v).__name__}")
    return v


class DeviceInfoDoc(BaseModel):
    """The keys of `device_info` that fill the devices table's columns; others are kept as given."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str | None = Field(None, max_length=_width(Device.name))
    compute_capability: str | None = Field(None, max_length=_width(Device.compute_capability))
    memory_bytes: int | None = Field(None, ge=0, le=INT64_MAX)
    multiprocessors: int | None = Field(None, ge=0, le=INT32_MAX)
    cuda_version: str | None = Field(None, max_length=_width(Device.cuda_version))
    driver_version: str | None = Field(None, max_length=_width(Device.driver_version))
    interpreter: bool | None = None


class TrialDoc(BaseModel):
    """One trial as exported (version 2)."""

    model_config = ConfigDict(extra="forbid")

    number: StrictInt
    state: Literal["complete", "fail"]
    config: dict[str, Any]
    latency_median_us: float | None = None
    failure_kind: str | None = None
    message: str | None = None

    @field_validator("number")
    @classmethod
    def _number(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must be >= 0")
        return v

    @field_validator("latency_median_us")
    @classmethod
    def _latency(cls, v: float | None) -> float | None:
        return _finite(v, "latency_median_us", positive=True)

    @model_validator(mode="after")
    def _outcome(self) -> TrialDoc:
        if self.state == "complete" and self.latency_median_us is None:
            raise ValueError("a complete trial needs latency_median_us")
        if self.state == "fail" and self.latency_median_us is not None:
            raise ValueError("a failed trial has no latency_median_us")
        return self


class RecordDoc(BaseModel):
    """One record as exported; the same rules validate `RecordIn` before it is stored.

    Strict types (`true` is no count, "1.5" no latency) and the columns' widths, so a record
    SQLite accepts is one PostgreSQL accepts too.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    kernel: str = Field(max_length=_width(Kernel.name))
    axes: dict[str, AxisValue]
    work: float
    device: str = Field(max_length=_width(Device.name))
    device_info: DeviceInfoDoc | None = None
    torch_version: str = Field(max_length=_width(Record.torch_version))
    triton_version: str = Field(max_length=_width(Record.triton_version))
    source_hash: str = Field(max_length=_width(Record.source_hash))
    config: dict[str, Any]
    latency_median_us: float
    latency_min_us: float
    latency_max_us: float
    latency_iqr_us: float
    timing_method: Literal["cupti", "interpreter-wallclock"]
    roofline_pct: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    eager_latency_us: float | None = None
    compile_latency_us: float | None = None
    rel_error: float
    n_trials: StrictInt = Field(ge=0, le=INT32_MAX)
    n_failed: StrictInt = Field(0, ge=0, le=INT32_MAX)
    study_name: str | None = Field(None, max_length=_width(Record.study_name))
    job_id: StrictInt | None = Field(None, ge=0, le=INT32_MAX)
    tuned_at: datetime = Field(strict=False)
    trials: list[TrialDoc] = []
    # Present in exports for readers; ignored on import (the supersede rule decides them).
    id: int | None = None
    is_current: bool | None = None
    superseded_at: datetime | None = Field(None, strict=False)
    superseded_by: int | None = None

    @field_validator("kernel", "device", "torch_version", "triton_version", "source_hash")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("axes")
    @classmethod
    def _axes(cls, v: dict[str, AxisValue]) -> dict[str, AxisValue]:
        if len(axes_key(v)) > _width(Case.axes_key):
            raise ValueError(f"longer than {_width(Case.axes_key)} characters as JSON")
        return v

    @field_validator("tuned_at", "superseded_at", mode="before")
    @classmethod
    def _when(cls, v: Any) -> Any:
        return v if v is None else _datetime_text(v)

    @field_validator("work", "latency_iqr_us", "rel_error", "roofline_pct")
    @classmethod
    def _non_negative(cls, v: float | None, info: Any) -> float | None:
        return _finite(v, info.field_name)

    @field_validator(
        "latency_median_us", "latency_min_us", "latency_max_us", "speedup_eager", "speedup_compile",
        "eager_latency_us", "compile_latency_us",
    )
    @classmethod
    def _positive(cls, v: float | None, info: Any) -> float | None:
        return _finite(v, info.field_name, positive=True)

    @field_validator("tuned_at")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        return (v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v).astimezone(timezone.utc)

    @model_validator(mode="after")
    def _ordered(self) -> RecordDoc:
        if not self.latency_min_us <= self.latency_median_us <= self.latency_max_us:
            raise ValueError("latencies must satisfy latency_min_us <= latency_median_us <= latency_max_us")
        return self

    @model_validator(mode="after")
    def _speedups_from_references(self) -> RecordDoc:
        # A speedup is the reference's latency over the record's: computable whenever the
        # reference was measured, so a record that carries one always shows the other.
        if self.speedup_eager is None and self.eager_latency_us is not None:
            self.speedup_eager = self.eager_latency_us / self.latency_median_us
        if self.speedup_compile is None and self.compile_latency_us is not None:
            self.speedup_compile = self.compile_latency_us / self.latency_median_us
        return self

    @model_validator(mode="after")
    def _trials_need_a_study(self) -> RecordDoc:
        if self.trials and not self.study_name:
            raise ValueError("trials need the record's study_name")
        numbers = [t.number for t in self.trials]
        if len(set(numbers)) != len(numbers):
            raise ValueError("trials: each trial number may appear once")
        return self

    def to_record_in(self) -> RecordIn:
        names = {f.name for f in fields(RecordIn)}
        d = {k: v for k, v in self.model_dump().items() if k in names}
        # device_info as given: no keys added for the columns it did not name.
        d["device_info"] = self.device_info.model_dump(exclude_unset=True) if self.device_info else None
        d["trials"] = [TrialIn(**t) for t in d.get("trials") or []]
        return RecordIn(**d)


def _first_error(e: ValidationError) -> tuple[str, str]:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(entry)"
    return loc, err["msg"]


def _validated(rec: RecordIn) -> RecordIn:
    if not isinstance(rec, RecordIn):
        raise TypeError(f"rec: expected db.store.RecordIn, got {type(rec).__name__}")
    try:
        return RecordDoc.model_validate(asdict(rec)).to_record_in()
    except ValidationError as e:
        loc, msg = _first_error(e)
        raise ValueError(f"rec.{loc}: {msg}") from None


def _fingerprint(r: RecordIn) -> str:
    """Hash of what a record measured; equal for the same record exported and re-imported."""
    body = {
        "kernel": r.kernel,
        "axes": axes_key(r.axes),
        "device": r.device,
        "torch": r.torch_version,
        "triton": r.triton_version,
        "source": r.source_hash,
        "config": r.config,
        "lat": [r.latency_median_us, r.latency_min_us, r.latency_max_us, r.latency_iqr_us],
        "method": r.timing_method,
        "rel_error": r.rel_error,
        "tuned_at": r.tuned_at.astimezone(timezone.utc).isoformat(timespec="microseconds"),
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_status(status: str | None, arg: str, allowed: tuple[str, ...] = JOB_STATUSES) -> None:
    if status is not None and status not in allowed:
        raise ValueError(f"{arg}: {status!r} is not one of {', '.join(allowed)}")


def _check_name(v: Any, arg: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{arg}: expected a non-empty string, got {v!r}")
    return v


def _retryable(e: sa_exc.DBAPIError) -> bool:
    # PostgreSQL serialization failure / deadlock; unique races settle on a second try.
    return isinstance(e, sa_exc.IntegrityError) or getattr(e.orig, "sqlstate", None) in ("40001", "40P01")


# ----------------------------------------------------------------------------- store


class Store:
    """Jobs, records, devices and trial summaries in one SQL database (SQLite or PostgreSQL)."""

    def __init__(self, url: str, *, _engine: Engine | None = None, retry_s: float = 0.0,
                 statement_timeout_ms: int | None = None, lock_timeout_ms: int | None = None,
                 pool_timeout_s: float | None = None) -> None:
        """`retry_s`: how long a transaction is retried on a transient failure (a dropped
        connection, a server that is restarting) before StoreUnavailable; a worker's store
        rides out outages, a lookup's answers at once. The timeouts (PostgreSQL) bound how long
        one statement, one lock wait and one wait for a pooled connection may take."""
        self.engine: Engine = _engine if _engine is not None else make_engine(
            url, statement_timeout_ms=statement_timeout_ms, lock_timeout_ms=lock_timeout_ms,
            pool_timeout_s=pool_timeout_s)
        self.url: str = url
        self.retry_s = float(retry_s)
        self._owns_engine = _engine is None
        self._read = sessionmaker(bind=self.engine, expire_on_commit=False)
        self._write = sessionmaker(
            bind=self.engine.execution_options(ks_write=True), expire_on_commit=False
        )

    @classmethod
    def from_engine(cls, engine: Engine) -> Store:
        return cls(engine.url.render_as_string(hide_password=False), _engine=engine)

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.engine.url.render_as_string(hide_password=True)!r})"

    # -- transactions --------------------------------------------------------------

    def _tx(self, fn: Callable[[Session], T], *, write: bool) -> T:
        """Run fn in one transaction; retry writes on PostgreSQL serialization/deadlock errors,
        and any transaction on a transient failure for up to `retry_s` seconds."""
        if self.retry_s <= 0:
            return self._tx_once(fn, write=write)
        return retrying(self.retry_s)(self._tx_once, fn, write=write)

    def _tx_once(self, fn: Callable[[Session], T], *, write: bool) -> T:
        maker = self._write if write else self._read
        with translate_errors():
            for attempt in range(_RETRIES):
                try:
                    with maker.begin() as s:
                        return fn(s)
                except sa_exc.DBAPIError as e:
                    if write and _retryable(e) and attempt < _RETRIES - 1:
                        time.sleep(0.01 * 2**attempt)
                        continue
                    if isinstance(e, sa_exc.IntegrityError):
                        raise Conflict(f"write conflicted with another writer: {e.orig}") from e
                    raise
        raise AssertionError("unreachable")

    def _insert(self, s: Session, table: Any) -> Any:
        mod = pg_dialect if s.get_bind().dialect.name == "postgresql" else sqlite_dialect
        return mod.insert(table)

    def _lock_counter(self, s: Session, name: str) -> None:
        # FOR UPDATE serialises writers on PostgreSQL; on SQLite BEGIN IMMEDIATE already did.
        s.execute(select(Counter.value).where(Counter.name == name).with_for_update()).first()

    def _bump(self, s: Session, name: str) -> None:
        res = s.execute(update(Counter).where(Counter.name == name).values(value=Counter.value + 1))
        if res.rowcount == 0:
            s.add(Counter(name=name, value=1))

    # -- health & devices ------------------------------------------------------------

    def ping(self) -> None:
        """Raise StoreUnavailable when the database cannot be reached."""
        with translate_errors(), self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def ensure_device(self, info: dict[str, Any]) -> int:
        """Insert or refresh a device from `kernels.device.device_info()`; returns its id."""
        if not isinstance(info, dict):
            raise ValueError(f"info: expected a dict as device_info() returns, got {type(info).__name__}")
        name = _check_name(info.get("name"), "info['name']")
        return self._tx(lambda s: self._device_id(s, name, info), write=True)

    def _device_id(self, s: Session, name: str, info: dict[str, Any] | None) -> int:
        now = utcnow()
        values: dict[str, Any] = {"name": name, "first_seen_at": now, "last_seen_at": now}
        if info:
            cc = info.get("compute_capability")
            values.update(
                compute_capability=str(cc) if cc is not None else None,
                memory_bytes=info.get("memory_bytes"),
                multiprocessors=info.get("multiprocessors"),
                cuda_version=info.get("cuda_version"),
                driver_version=info.get("driver_version"),
                interpreter=bool(info.get("interpreter", False)),
                info=info,
            )
        else:
            values["interpreter"] = False
        ins = self._insert(s, Device).values(**values)
        refresh = {k: v for k, v in values.items() if k not in ("name", "first_seen_at")}
        if not info:
            refresh = {"last_seen_at": now}
        stmt = ins.on_conflict_do_update(index_elements=["name"], set_=refresh).returning(Device.id)
        return int(s.execute(stmt).scalar_one())

    def _kernel_id(self, s: Session, name: str) -> int:
        ins = self._insert(s, Kernel).values(name=name, created_at=utcnow())
        s.execute(ins.on_conflict_do_nothing(index_elements=["name"]))
        return int(s.execute(select(Kernel.id).where(Kernel.name == name)).scalar_one())

    def _case_id(self, s: Session, kernel_id: int, axes: dict[str, int], work: float | None) -> int:
        key = axes_key(axes)
        ins = self._insert(s, Case).values(
            kernel_id=kernel_id, axes=dict(axes), axes_key=key, work=work, created_at=utcnow()
        )
        s.execute(ins.on_conflict_do_nothing(index_elements=["kernel_id", "axes_key"]))
        row = s.execute(
            select(Case.id, Case.work).where(Case.kernel_id == kernel_id, Case.axes_key == key)
        ).one()
        if row.work is None and work is not None:
            s.execute(update(Case).where(Case.id == row.id).values(work=work))
        return int(row.id)

    def list_devices(self) -> list[dict[str, Any]]:
        """Every device seen, with how many current records it has."""

        def q(s: Session) -> list[dict[str, Any]]:
            n = (
                select(Record.device_id, func.count().label("n"))
                .where(Record.is_current.is_(True))
                .group_by(Record.device_id)
                .subquery()
            )
            rows = s.execute(
                select(Device, func.coalesce(n.c.n, 0))
                .outerjoin(n, n.c.device_id == Device.id)
                .order_by(Device.name)
            ).all()
            return [
                {
                    "id": d.id,
                    "name": d.name,
                    "compute_capability": d.compute_capability,
                    "memory_bytes": d.memory_bytes,
                    "multiprocessors": d.multiprocessors,
                    "cuda_version": d.cuda_version,
                    "driver_version": d.driver_version,
                    "interpreter": d.interpreter,
                    "info": d.info,
                    "first_seen_at": d.first_seen_at.isoformat(),
                    "last_seen_at": d.last_seen_at.isoformat(),
                    "n_records": int(count),
                }
                for d, count in rows
            ]

        return self._tx(q, write=False)

    # -- jobs ------------------------------------------------------------------------

    def _job_view(self, job: Job, kernel: str) -> JobView:
        return JobView(
            id=job.id,
            kernel=kernel,
            cases=list(job.cases),
            n_trials=job.n_trials,
            sampler=job.sampler,
            timeout_s=job.timeout_s,
            status=job.status,
            trials_done=job.trials_done,
            device=job.device,
            best=job.best,
            error=job.error,
            owner=job.owner,
            heartbeat_at=job.heartbeat_at,
            attempts=job.attempts,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            current_case=job.current_case,
        )

    def _load_job(self, s: Session, job_id: int) -> JobView | None:
        row = s.execute(
            select(Job, Kernel.name).join(Kernel, Kernel.id == Job.kernel_id).where(Job.id == job_id)
        ).first()
        return None if row is None else self._job_view(row[0], row[1])

    def create_job(
        self,
        kernel: str,
        cases: list[dict[str, int]],
        n_trials: int,
        sampler: str,
        timeout_s: float | None = None,
        max_queued: int | None = None,
    ) -> JobView:
        """Queue a job (or return the identical one already queued or running); Conflict when
        `max_queued` jobs are already waiting."""
        _check_name(kernel, "kernel")
        _check_name(sampler, "sampler")
        if not isinstance(cases, list) or not cases:
            raise ValueError("cases: expected a non-empty list of axes dicts")
        for i, c in enumerate(cases):
            axes_key(c, arg=f"cases[{i}]")
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise ValueError(f"n_trials: expected an int >= 1, got {n_trials!r}")
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s: expected a number > 0 or None, got {timeout_s!r}")
        if max_queued is not None and (not isinstance(max_queued, int) or max_queued < 0):
            raise ValueError(f"max_queued: expected an int >= 0 or None, got {max_queued!r}")

        wanted = [axes_key(c) for c in cases]
        limit_s = float(timeout_s) if timeout_s is not None else None

        def tx(s: Session) -> JobView:
            self._lock_counter(s, "jobs")
            # A job asking for work an identical job already queued or running will do is that
            # job: twenty identical submits spend the budget once (a job adds n_trials to each
            # of its cases' studies, so a duplicate would add them again).
            kid = self._kernel_id(s, kernel)
            for same in s.execute(
                select(Job).where(Job.kernel_id == kid, Job.status.in_(("queued", "running")),
                                  Job.n_trials == n_trials, Job.sampler == sampler)
                .order_by(Job.id)
            ).scalars():
                if same.timeout_s == limit_s and [axes_key(dict(c)) for c in same.cases] == wanted:
                    return self._job_view(same, kernel)
            if max_queued is not None:
                queued = s.execute(select(func.count()).where(Job.status == "queued")).scalar_one()
                if queued >= max_queued:
                    raise Conflict(
                        f"{queued} jobs are already queued (limit {max_queued}); "
                        "wait for some to finish or cancel them"
                    )
            job = Job(
                kernel_id=kid,
                cases=[dict(c) for c in cases],
                n_trials=n_trials,
                sampler=sampler,
                timeout_s=float(timeout_s) if timeout_s is not None else None,
                status="queued",
                trials_done=0,
                attempts=0,
                created_at=utcnow(),
            )
            s.add(job)
            s.flush()
            self._bump(s, "jobs")
            return self._job_view(job, kernel)

        return self._tx(tx, write=True)

    def get_job(self, job_id: int) -> JobView | None:
        return self._tx(lambda s: self._load_job(s, job_id), write=False)

    def list_jobs(self, status: str | None = None, limit: int = 100) -> list[JobView]:
        """Newest first."""
        _check_status(status, "status")
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit: expected an int >= 1, got {limit!r}")

        def q(s: Session) -> list[JobView]:
            stmt = select(Job, Kernel.name).join(Kernel, Kernel.id == Job.kernel_id)
            if status is not None:
                stmt = stmt.where(Job.status == status)
            rows = s.execute(stmt.order_by(Job.id.desc()).limit(limit)).all()
            return [self._job_view(j, k) for j, k in rows]

        return self._tx(q, write=False)

    def count_jobs(self, status: str | None = None) -> int:
        _check_status(status, "status")

        def q(s: Session) -> int:
            stmt = select(func.count()).select_from(Job)
            if status is not None:
                stmt = stmt.where(Job.status == status)
            return int(s.execute(stmt).scalar_one())

        return self._tx(q, write=False)

    def claim_job(self, owner: str, lease_seconds: float) -> JobView | None:
        """Take the oldest queued job, or a running one whose heartbeat is older than the lease."""
        _check_name(owner, "owner")
        _check_positive(lease_seconds, "lease_seconds")

        def tx(s: Session) -> JobView | None:
            now = utcnow()
            cutoff = now - timedelta(seconds=float(lease_seconds))
            claimable = or_(
                Job.status == "queued",
                and_(Job.status == "running", or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < cutoff)),
            )
            pick = (
                select(Job.id)
                .where(claimable)
                .order_by(Job.id)
                .limit(1)
                .with_for_update(skip_locked=True)
                .scalar_subquery()
            )
            stmt = (
                update(Job)
                .where(Job.id == pick, claimable)
                .values(
                    status="running",
                    owner=owner,
                    heartbeat_at=now,
                    started_at=func.coalesce(Job.started_at, now),
                    attempts=Job.attempts + 1,
                )
                .returning(Job.id)
                .execution_options(synchronize_session=False)
            )
            job_id = s.execute(stmt).scalar_one_or_none()
            return None if job_id is None else self._load_job(s, job_id)

        return self._tx(tx, write=True)

    def _owned(self, job_id: int, owner: str) -> Any:
        return and_(Job.id == job_id, Job.owner == owner, Job.status == "running")

    def heartbeat(self, job_id: int, owner: str) -> bool:
        """Renew the lease (and the owner's study claims); False when the job was cancelled,
        finished or claimed by another."""
        now = utcnow()
        stmt = (
            update(Job)
            .where(self._owned(job_id, owner))
            .values(heartbeat_at=now)
            .execution_options(synchronize_session=False)
        )

        def tx(s: Session) -> bool:
            ours = s.execute(stmt).rowcount == 1
            if ours:
                s.execute(update(StudyClaim).where(StudyClaim.owner == owner)
                          .values(heartbeat_at=now).execution_options(synchronize_session=False))
            return ours

        return self._tx(tx, write=True)

    def release_job(self, job_id: int, owner: str) -> bool:
        """Hand a running job we own back to the queue at once (a worker told to stop), keeping
        its progress; False when it was cancelled, finished or re-claimed meanwhile."""
        stmt = (
            update(Job)
            .where(self._owned(job_id, owner))
            .values(status="queued", owner=None, heartbeat_at=None)
            .execution_options(synchronize_session=False)
        )

        def tx(s: Session) -> bool:
            s.execute(delete(StudyClaim).where(StudyClaim.owner == owner))
            return s.execute(stmt).rowcount == 1

        return self._tx(tx, write=True)

    # -- study claims ----------------------------------------------------------------

    def claim_study(self, study_name: str, owner: str, lease_seconds: float,
                    job_id: int | None = None) -> str | None:
        """Take the study for `owner`; None when taken (or already ours), else the owner that
        holds it now. A claim older than `lease_seconds` (its worker died) is taken over."""
        _check_name(study_name, "study_name")
        _check_name(owner, "owner")
        _check_positive(lease_seconds, "lease_seconds")

        def tx(s: Session) -> str | None:
            now = utcnow()
            cutoff = now - timedelta(seconds=float(lease_seconds))
            ins = self._insert(s, StudyClaim).values(study_name=study_name, owner=owner,
                                                      job_id=job_id, heartbeat_at=now)
            s.execute(ins.on_conflict_do_nothing(index_elements=["study_name"]))
            taken = s.execute(
                update(StudyClaim)
                .where(StudyClaim.study_name == study_name,
                       or_(StudyClaim.owner == owner, StudyClaim.heartbeat_at < cutoff))
                .values(owner=owner, job_id=job_id, heartbeat_at=now)
                .execution_options(synchronize_session=False)
            ).rowcount
            if taken:
                return None
            return s.execute(select(StudyClaim.owner)
                             .where(StudyClaim.study_name == study_name)).scalar_one_or_none()

        return self._tx(tx, write=True)

    def release_study(self, study_name: str, owner: str) -> None:
        """Give a study back once its case is done (or left)."""
        self._tx(lambda s: s.execute(delete(StudyClaim).where(
            StudyClaim.study_name == study_name, StudyClaim.owner == owner)), write=True)

    def update_job_progress(
        self,
        job_id: int,
        owner: str,
        *,
        trials_done: int,
        device: str | None = None,
        best: dict[str, Any] | None = None,
        current_case: dict[str, Any] | None = None,
    ) -> bool:
        """Record progress (and renew the lease); False when the lease is no longer ours."""
        if isinstance(trials_done, bool) or not isinstance(trials_done, int) or trials_done < 0:
            raise ValueError(f"trials_done: expected an int >= 0, got {trials_done!r}")
        # Never backwards: a worker taking the job over recounts from its studies.
        values: dict[str, Any] = {
            "trials_done": sa_case((Job.trials_done > trials_done, Job.trials_done), else_=trials_done),
            "heartbeat_at": utcnow(),
        }
        if device is not None:
            values["device"] = device
        if best is not None:
            values["best"] = best
        if current_case is not None:
            values["current_case"] = current_case
        stmt = (
            update(Job)
            .where(self._owned(job_id, owner))
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        return self._tx(lambda s: s.execute(stmt).rowcount == 1, write=True)

    def finish_job(self, job_id: int, owner: str, status: str, error: str | None = None) -> bool:
        """Close a job we own; False when it was cancelled or re-claimed meanwhile."""
        _check_status(status, "status", FINISHED_STATUSES)
        stmt = (
            update(Job)
            .where(self._owned(job_id, owner))
            .values(status=status, error=error, finished_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        return self._tx(lambda s: s.execute(stmt).rowcount == 1, write=True)

    def cancel_job(self, job_id: int) -> JobView | None:
        """queued/running -> cancelled; a finished job is returned unchanged; None if unknown."""

        def tx(s: Session) -> JobView | None:
            s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(("queued", "running")))
                .values(status="cancelled", finished_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return self._load_job(s, job_id)

        return self._tx(tx, write=True)

    # -- records ---------------------------------------------------------------------

    def _records_query(self) -> Any:
        return (
            select(Record, Kernel.name, Case.axes, Case.work, Device.name)
            .join(Kernel, Kernel.id == Record.kernel_id)
            .join(Case, Case.id == Record.case_id)
            .join(Device, Device.id == Record.device_id)
        )

    @staticmethod
    def _record_view(row: Any) -> RecordView:
        r, kernel, axes, work, device = row
        return RecordView(
            id=r.id,
            kernel=kernel,
            axes=dict(axes),
            work=work,
            device=device,
            device_info=r.device_info,
            torch_version=r.torch_version,
            triton_version=r.triton_version,
            source_hash=r.source_hash,
            config=r.config,
            latency_median_us=r.latency_median_us,
            latency_min_us=r.latency_min_us,
            latency_max_us=r.latency_max_us,
            latency_iqr_us=r.latency_iqr_us,
            timing_method=r.timing_method,
            roofline_pct=r.roofline_pct,
            speedup_eager=r.speedup_eager,
            speedup_compile=r.speedup_compile,
            rel_error=r.rel_error,
            n_trials=r.n_trials,
            n_failed=r.n_failed,
            study_name=r.study_name,
            job_id=r.job_id,
            tuned_at=r.tuned_at,
            is_current=r.is_current,
            superseded_at=r.superseded_at,
            superseded_by=r.superseded_by,
            eager_latency_us=r.eager_latency_us,
            compile_latency_us=r.compile_latency_us,
        )

    def _load_record(self, s: Session, record_id: int) -> RecordView:
        return self._record_view(s.execute(self._records_query().where(Record.id == record_id)).one())

    def _upsert_locked(self, s: Session, rec: RecordIn) -> tuple[int, bool, bool, bool]:
        """Store rec under the records lock. Returns (id, became_current, superseded_one, new)."""
        fp = _fingerprint(rec)
        existing = s.execute(select(Record.id).where(Record.fingerprint == fp)).scalar_one_or_none()
        if existing is not None:
            return existing, False, False, False
        kernel_id = self._kernel_id(s, rec.kernel)
        case_id = self._case_id(s, kernel_id, rec.axes, rec.work)
        device_id = self._device_id(s, rec.device, rec.device_info)
        current = s.execute(
            select(Record.id, Record.latency_median_us).where(
                Record.case_id == case_id, Record.device_id == device_id, Record.is_current.is_(True)
            )
        ).first()
        better = current is None or rec.latency_median_us < current.latency_median_us
        now = utcnow()
        if better and current is not None:
            s.execute(
                update(Record)
                .where(Record.id == current.id)
                .values(is_current=False, superseded_at=now)
                .execution_options(synchronize_session=False)
            )
        row = Record(
            kernel_id=kernel_id,
            case_id=case_id,
            device_id=device_id,
            device_info=rec.device_info,
            torch_version=rec.torch_version,
            triton_version=rec.triton_version,
            source_hash=rec.source_hash,
            config=rec.config,
            latency_median_us=rec.latency_median_us,
            latency_min_us=rec.latency_min_us,
            latency_max_us=rec.latency_max_us,
            latency_iqr_us=rec.latency_iqr_us,
            timing_method=rec.timing_method,
            roofline_pct=rec.roofline_pct,
            speedup_eager=rec.speedup_eager,
            speedup_compile=rec.speedup_compile,
            eager_latency_us=rec.eager_latency_us,
            compile_latency_us=rec.compile_latency_us,
            rel_error=rec.rel_error,
            n_trials=rec.n_trials,
            n_failed=rec.n_failed,
            study_name=rec.study_name,
            job_id=rec.job_id,
            tuned_at=rec.tuned_at,
            created_at=now,
            is_current=better,
            superseded_at=None if better else now,
            superseded_by=None if better or current is None else current.id,
            fingerprint=fp,
        )
        s.add(row)
        s.flush()
        if better and current is not None:
            s.execute(
                update(Record)
                .where(Record.id == current.id)
                .values(superseded_by=row.id)
                .execution_options(synchronize_session=False)
            )
        return row.id, better, better and current is not None, True

    def _add_trials_locked(self, s: Session, rec: RecordIn) -> int:
        """Store the trials a record carries under its study; trials already there are kept as
        they are. Returns how many were new."""
        if not rec.trials or not rec.study_name:
            return 0
        kernel_id = self._kernel_id(s, rec.kernel)
        case_id = self._case_id(s, kernel_id, rec.axes, rec.work)
        device_id = self._device_id(s, rec.device, rec.device_info)
        now = utcnow()
        rows = [
            {
                "study_name": rec.study_name,
                "trial_number": t.number,
                "kernel_id": kernel_id,
                "case_id": case_id,
                "device_id": device_id,
                "state": t.state,
                "config": t.config,
                "latency_median_us": t.latency_median_us,
                "failure_kind": t.failure_kind,
                "message": t.message,
                "extra": None,
                # Not rec.job_id: that job belongs to the database that tuned the record, and
                # here the number may name another job.
                "job_id": None,
                "created_at": now,
                "updated_at": now,
            }
            for t in rec.trials
        ]
        added = 0
        for i in range(0, len(rows), 200):
            ins = self._insert(s, TrialSummary).values(rows[i : i + 200])
            stmt = ins.on_conflict_do_nothing(index_elements=["study_name", "trial_number"])
            added += len(s.execute(stmt.returning(TrialSummary.id)).all())
        return added

    def _fill_references_locked(self, s: Session, record_id: int, rec: RecordIn) -> bool:
        """Give a stored record the references (and speedups) it lacks and `rec`, the same
        measurement exported by newer code, carries. True when something was filled."""
        filled = False
        for col in ("eager_latency_us", "compile_latency_us", "speedup_eager", "speedup_compile"):
            value = getattr(rec, col)
            if value is None:
                continue
            column = getattr(Record, col)
            res = s.execute(
                update(Record)
                .where(Record.id == record_id, column.is_(None))
                .values({column: value})
                .execution_options(synchronize_session=False)
            )
            filled |= bool(res.rowcount)
        return filled

    def upsert_best(self, rec: RecordIn) -> tuple[RecordView, bool]:
        """Store a result; True when it became the current best (strictly faster median, or the
        first for its key). A slower one is kept as history only. Storing the identical record
        again changes nothing and returns (existing, False)."""
        rec = _validated(rec)

        def tx(s: Session) -> tuple[RecordView, bool]:
            self._lock_counter(s, "records")
            rid, improved, _, new = self._upsert_locked(s, rec)
            self._add_trials_locked(s, rec)
            if new:
                self._bump(s, "records")
            return self._load_record(s, rid), improved

        return self._tx(tx, write=True)

    def find_best(
        self, kernel: str, device: str, axes: dict[str, Any], work: float,
        distance: Callable[[dict[str, Any], float], float] | None = None,
    ) -> tuple[RecordView, str] | None:
        """The current record for exactly these axes ("exact"), else the current record of the
        same kernel and device nearest to them ("nearest"). "Nearest" is the kernel's own
        definition (`KernelDef.distance`, passed as `distance(axes, work)` of a candidate, where
        an infinite distance means never: another dtype, say); without it, the log ratio of work."""
        key = axes_key(axes)
        if not isinstance(work, (int, float)) or isinstance(work, bool) or not math.isfinite(work):
            raise ValueError(f"work: expected a finite number, got {work!r}")
        if distance is None:
            def distance(_axes: dict[str, Any], w: float) -> float:
                return abs(math.log(max(w, 1.0)) - math.log(max(float(work), 1.0)))

        def q(s: Session) -> tuple[RecordView, str] | None:
            base = self._records_query().where(
                Kernel.name == kernel, Device.name == device, Record.is_current.is_(True)
            )
            row = s.execute(base.where(Case.axes_key == key)).first()
            if row is not None:
                return self._record_view(row), "exact"
            cands = s.execute(
                select(Case.id, Case.axes, Case.work)
                .join(Record, Record.case_id == Case.id)
                .join(Kernel, Kernel.id == Case.kernel_id)
                .join(Device, Device.id == Record.device_id)
                .where(Kernel.name == kernel, Device.name == device,
                       Record.is_current.is_(True), Case.work.is_not(None))
            ).all()
            ranked = sorted((distance(dict(ax), float(w)), cid) for cid, ax, w in cands)
            if not ranked or not math.isfinite(ranked[0][0]):
                return None
            row = s.execute(base.where(Case.id == ranked[0][1])).first()
            return None if row is None else (self._record_view(row), "nearest")

        return self._tx(q, write=False)

    def list_records(
        self, kernel: str | None = None, device: str | None = None, include_history: bool = False
    ) -> list[RecordView]:
        """Records ordered by kernel, device, case work, then time."""

        def q(s: Session) -> list[RecordView]:
            stmt = self._records_query()
            if kernel is not None:
                stmt = stmt.where(Kernel.name == kernel)
            if device is not None:
                stmt = stmt.where(Device.name == device)
            if not include_history:
                stmt = stmt.where(Record.is_current.is_(True))
            stmt = stmt.order_by(Kernel.name, Device.name, Case.work, Case.axes_key, Record.tuned_at, Record.id)
            return [self._record_view(r) for r in s.execute(stmt).all()]

        return self._tx(q, write=False)

    def record_history(self, kernel: str, device: str, axes: dict[str, int]) -> list[RecordView]:
        """Every record of one key, oldest first (the current one included)."""
        key = axes_key(axes)

        def q(s: Session) -> list[RecordView]:
            stmt = (
                self._records_query()
                .where(Kernel.name == kernel, Device.name == device, Case.axes_key == key)
                .order_by(Record.tuned_at, Record.id)
            )
            return [self._record_view(r) for r in s.execute(stmt).all()]

        return self._tx(q, write=False)

    def records_version(self) -> int:
        """A number that changes whenever records change (for cache invalidation)."""

        def q(s: Session) -> int:
            v = s.execute(select(Counter.value).where(Counter.name == "records")).scalar_one_or_none()
            return int(v or 0)

        return self._tx(q, write=False)

    # -- trial summaries ---------------------------------------------------------------

    def add_trial_summary(
        self,
        study_name: str,
        kernel: str,
        device: str,
        axes: dict[str, int],
        trial_number: int,
        state: str,
        config: dict[str, Any],
        latency_median_us: float | None,
        failure_kind: str | None,
        message: str | None,
        extra: dict[str, Any] | None = None,
        job_id: int | None = None,
    ) -> None:
        """Store (or update) one trial's outcome, keyed by (study_name, trial_number); `job_id`
        names the tuning job that ran it."""
        _check_name(study_name, "study_name")
        _check_name(kernel, "kernel")
        _check_name(device, "device")
        _check_name(state, "state")
        axes_key(axes)
        if isinstance(trial_number, bool) or not isinstance(trial_number, int) or trial_number < 0:
            raise ValueError(f"trial_number: expected an int >= 0, got {trial_number!r}")
        if not isinstance(config, dict):
            raise ValueError(f"config: expected a dict, got {type(config).__name__}")
        if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, int)):
            raise ValueError(f"job_id: expected an int or None, got {job_id!r}")

        def tx(s: Session) -> None:
            kernel_id = self._kernel_id(s, kernel)
            case_id = self._case_id(s, kernel_id, axes, None)
            device_id = self._device_id(s, device, None)
            now = utcnow()
            data = {
                "state": state,
                "config": config,
                "latency_median_us": latency_median_us,
                "failure_kind": failure_kind,
                "message": message,
                "extra": extra,
                "job_id": job_id,
                "updated_at": now,
            }
            ins = self._insert(s, TrialSummary).values(
                study_name=study_name,
                trial_number=trial_number,
                kernel_id=kernel_id,
                case_id=case_id,
                device_id=device_id,
                created_at=now,
                **data,
            )
            s.execute(ins.on_conflict_do_update(index_elements=["study_name", "trial_number"], set_=data))

        self._tx(tx, write=True)

    def trial_numbers(self, study_name: str) -> set[int]:
        """Optuna trial numbers that have a summary in a study (to repair missing ones)."""
        return self._tx(lambda s: set(s.execute(select(TrialSummary.trial_number).where(
            TrialSummary.study_name == study_name)).scalars()), write=False)

    def trial_summaries(self, kernel: str, device: str, axes: dict[str, int]) -> list[dict[str, Any]]:
        """Trial outcomes of one key, in study then Optuna trial-number order."""
        key = axes_key(axes)

        def q(s: Session) -> list[dict[str, Any]]:
            rows = s.execute(
                select(TrialSummary)
                .join(Kernel, Kernel.id == TrialSummary.kernel_id)
                .join(Case, Case.id == TrialSummary.case_id)
                .join(Device, Device.id == TrialSummary.device_id)
                .where(Kernel.name == kernel, Device.name == device, Case.axes_key == key)
                .order_by(TrialSummary.study_name, TrialSummary.trial_number)
            ).scalars()
            return [
                {
                    "study_name": t.study_name,
                    "trial_number": t.trial_number,
                    "state": t.state,
                    "config": t.config,
                    "latency_median_us": t.latency_median_us,
                    "failure_kind": t.failure_kind,
                    "message": t.message,
                    "extra": t.extra,
                    "job_id": t.job_id,
                    "created_at": t.created_at.isoformat(),
                    "updated_at": t.updated_at.isoformat(),
                }
                for t in rows
            ]

        return self._tx(q, write=False)

    def job_trials(self, job_id: int) -> list[dict[str, Any]]:
        """The trials a job ran, with their case and device, in case then trial-number order."""
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise ValueError(f"job_id: expected an int, got {job_id!r}")

        def q(s: Session) -> list[dict[str, Any]]:
            rows = s.execute(
                select(TrialSummary, Kernel.name, Case.axes, Device.name)
                .join(Kernel, Kernel.id == TrialSummary.kernel_id)
                .join(Case, Case.id == TrialSummary.case_id)
                .join(Device, Device.id == TrialSummary.device_id)
                .where(TrialSummary.job_id == job_id)
                .order_by(Case.work.asc().nulls_last(), Case.axes_key, TrialSummary.study_name,
                          TrialSummary.trial_number)
            ).all()
            return [
                {
                    "kernel": kernel,
                    "axes": dict(axes),
                    "device": device,
                    "study_name": t.study_name,
                    "trial_number": t.trial_number,
                    "state": t.state,
                    "config": t.config,
                    "latency_median_us": t.latency_median_us,
                    "failure_kind": t.failure_kind,
                    "message": t.message,
                    "job_id": t.job_id,
                }
                for t, kernel, axes, device in rows
            ]

        return self._tx(q, write=False)

    # -- export / import -------------------------------------------------------------

    def export_records(
        self, kernel: str | None = None, device: str | None = None, include_history: bool = False
    ) -> dict[str, Any]:
        """A JSON-able document of records, oldest first so an import replays the history."""
        recs = self.list_records(kernel=kernel, device=device, include_history=include_history)
        recs.sort(key=lambda r: (r.tuned_at, r.id))
        trials = self._export_trials({r.study_name for r in recs if r.study_name})
        out = []
        for r in recs:
            d = r.as_dict()
            for k in ("id", "superseded_by"):
                d.pop(k)
            d["trials"] = trials.get((r.study_name, r.kernel, axes_key(r.axes), r.device), [])
            out.append(d)
        return {
            "schema": EXPORT_SCHEMA,
            "version": EXPORT_VERSION,
            "exported_at": utcnow().isoformat(),
            "filters": {"kernel": kernel, "device": device, "include_history": include_history},
            "records": out,
        }

    def _export_trials(self, studies: set[str]) -> dict[tuple[str, str, str, str], list[dict[str, Any]]]:
        """The trials of these studies as an export carries them, per (study, kernel, axes key,
        device), in trial-number order; messages cut to EXPORT_MESSAGE_CHARS."""
        if not studies:
            return {}

        def q(s: Session) -> dict[tuple[str, str, str, str], list[dict[str, Any]]]:
            out: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
            names = sorted(studies)
            for i in range(0, len(names), 500):
                rows = s.execute(
                    select(TrialSummary, Kernel.name, Case.axes_key, Device.name)
                    .join(Kernel, Kernel.id == TrialSummary.kernel_id)
                    .join(Case, Case.id == TrialSummary.case_id)
                    .join(Device, Device.id == TrialSummary.device_id)
                    .where(TrialSummary.study_name.in_(names[i : i + 500]),
                           func.lower(TrialSummary.state).in_(TRIAL_STATES))
                    .order_by(TrialSummary.study_name, TrialSummary.trial_number)
                ).all()
                for t, kernel, key, device in rows:
                    msg = t.message[:EXPORT_MESSAGE_CHARS] if t.message else t.message
                    state = t.state.lower()
                    out.setdefault((t.study_name, kernel, key, device), []).append({
                        "number": t.trial_number,
                        "state": state,
                        "config": t.config,
                        "latency_median_us": t.latency_median_us if state == "complete" else None,
                        "failure_kind": t.failure_kind,
                        "message": msg,
                    })
            return out

        return self._tx(q, write=False)

    def import_records(self, doc: dict[str, Any], *, check: EntryCheck | None = None) -> ImportReport:
        """Validate every entry (and `check` it, see parse_records_doc), then store them all in
        one transaction (or none).

        Each entry goes through the same rule as upsert_best; entries already present are
        counted unchanged, so importing the same document twice changes nothing.
        """
        recs = parse_records_doc(doc, check=check)

        def tx(s: Session) -> ImportReport:
            self._lock_counter(s, "records")
            added = superseded = unchanged = trials = 0
            filled = False
            for rec in recs:
                rid, _, sup, new = self._upsert_locked(s, rec)
                filled |= not new and self._fill_references_locked(s, rid, rec)
                trials += self._add_trials_locked(s, rec)
                added += new
                superseded += sup
                unchanged += not new
            if added or filled:
                self._bump(s, "records")
            return ImportReport(added=added, superseded=superseded, unchanged=unchanged,
                                trials_added=trials)

        return self._tx(tx, write=True)

    def has_records(self) -> bool:
        """True when at least one record is stored (used by `records import --if-empty`)."""
        return self._tx(lambda s: s.execute(select(Record.id).limit(1)).first() is not None, write=False)


# Checks an entry beyond its types (e.g. against the kernel's declaration, which this layer does
# not know): raises ImportRejected with `field` set; the index is added here.
EntryCheck = Callable[[RecordIn], None]


def parse_records_doc(doc: Any, *, check: EntryCheck | None = None) -> list[RecordIn]:
    """Validate an export document whole; ImportRejected names the first bad entry and field."""
    if not isinstance(doc, dict):
        raise ImportRejected(f"document: expected a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != EXPORT_SCHEMA:
        raise ImportRejected(
            f"document: 'schema' must be {EXPORT_SCHEMA!r}, got {doc.get('schema')!r}", field="schema"
        )
    version = doc.get("version")
    if type(version) is not int or version not in IMPORT_VERSIONS:  # `true` == 1 in Python
        raise ImportRejected(
            f"document: unsupported version {version!r}; this code reads versions "
            f"{', '.join(map(str, IMPORT_VERSIONS))}",
            field="version",
        )
    entries = doc.get("records")
    if not isinstance(entries, list):
        raise ImportRejected("document: 'records' must be a list", field="records")
    out: list[RecordIn] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ImportRejected(f"records[{i}]: expected an object", index=i)
        bad = first_unportable(entry, ("records", i))
        if bad is not None:
            loc, why = bad
            raise ImportRejected(f"{dotted(loc)}: {why}", index=i, field=dotted(loc[2:]) or None)
        try:
            rec = RecordDoc.model_validate(entry).to_record_in()
        except ValidationError as e:
            loc, msg = _first_error(e)
            raise ImportRejected(f"records[{i}].{loc}: {msg}", index=i, field=loc) from None
        if check is not None:
            try:
                check(rec)
            except ImportRejected as e:
                where = e.field or "(entry)"
                raise ImportRejected(f"records[{i}].{where}: {e}", index=i, field=e.field) from None
        out.append(rec)
    return out
