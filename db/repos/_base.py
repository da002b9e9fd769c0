"""What every repository shares: the engine, one transaction per call, and the key rows.

Concurrency rules (both SQLite and PostgreSQL):
- writes on SQLite start with `BEGIN IMMEDIATE` (see db.engine), so they are serialised;
- a job is claimed by one conditional UPDATE whose subquery takes the row `FOR UPDATE SKIP
  LOCKED` on PostgreSQL, and whose outer WHERE repeats the condition (atomic on SQLite);
- writers of records lock the `records` counter row first, so "read the current best, compare,
  replace" never interleaves; a partial unique index keeps at most one current record per key.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from sqlalchemy import CursorResult, Engine, Result, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.orm import Session, sessionmaker

from ..checks import axes_key, check_kernel_name, kernel_key
from ..engine import make_engine, retrying, translate_errors
from ..errors import Conflict, LeaseLost
from ..models import Case, Counter, Device, Job, Kernel, utcnow, kernel_named
from ..views import WORKER_VERSIONS

if TYPE_CHECKING:
    from ..interfaces import Lease

_RETRIES = 6
T = TypeVar("T")


def _retryable(e: sa_exc.DBAPIError) -> bool:
    # PostgreSQL serialization failure / deadlock; unique races settle on a second try.
    return isinstance(e, sa_exc.IntegrityError) or getattr(e.orig, "sqlstate", None) in ("40001", "40P01")



def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE matched: its result is a CursorResult, which Session.execute is
    typed to return as a plain Result."""
    return cast(CursorResult[Any], result).rowcount

def hold_job(s: Session, lease: Lease) -> None:
    """Raise LeaseLost unless no one claimed the job since `lease` (its attempt is still the
    lease's token). On PostgreSQL the row is share-locked until the transaction ends, so a
    claim by another worker waits for this transaction instead of slipping in before its commit
    (on SQLite, write transactions are serialised already)."""
    held = s.execute(
        select(Job.id).where(Job.id == lease.job_id, Job.attempts == lease.token)
        .with_for_update(read=True)
    ).first()
    if held is None:
        raise lease_lost(s, lease)


def lease_lost(s: Session, lease: Lease) -> LeaseLost:
    """The error for a write refused under `lease`, saying what became of the job."""
    row = s.execute(select(Job.status, Job.owner, Job.attempts).where(Job.id == lease.job_id)).first()
    if row is None:
        why = "no such job"
    elif row.attempts != lease.token:
        why = f"claimed again (attempt {row.attempts}, by {row.owner})"
    else:
        why = f"it is {row.status}"
    return LeaseLost(f"job {lease.job_id}: the lease of attempt {lease.token} ({lease.owner}) "
                     f"is no longer held: {why}")


class RepoBase:
    """One SQL database (SQLite or PostgreSQL) and the transaction every repository method runs in;
    each repository extends it, and `db.store.Store` combines them over one engine."""

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
        self._lease: Lease | None = None

    def under_lease(self, lease: Lease) -> Self:
        """This store (same engine) for the writes a worker makes on behalf of a job: each write
        transaction first checks, in that transaction, that `lease` still holds the job, and
        raises LeaseLost (writing nothing) when the job was claimed again since."""
        fenced = copy.copy(self)
        fenced._lease = lease
        fenced._owns_engine = False
        return fenced

    @classmethod
    def from_engine(cls, engine: Engine) -> Self:
        return cls(engine.url.render_as_string(hide_password=False), _engine=engine)

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine.url.render_as_string(hide_password=True)!r})"

    def ping(self) -> None:
        """Raise StoreUnavailable when the database cannot be reached."""
        with translate_errors(), self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

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
                        if write and self._lease is not None:
                            hold_job(s, self._lease)
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
        if rowcount(res) == 0:
            s.add(Counter(name=name, value=1))

    # -- the key rows records, trials and jobs hang off ------------------------------

    def _device_id(self, s: Session, name: str, info: dict[str, Any] | None) -> int:
        now = utcnow()
        values: dict[str, Any] = {"name": name, "first_seen_at": now, "last_seen_at": now}
        if info and WORKER_VERSIONS not in info:
            # A record's device_info does not carry what a worker reported: keep the last report.
            old = s.execute(select(Device.info).where(Device.name == name)).scalar_one_or_none()
            if old and WORKER_VERSIONS in old:
                info = {**info, WORKER_VERSIONS: old[WORKER_VERSIONS]}
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
        check_kernel_name(name)
        ins = self._insert(s, Kernel).values(name=name, name_key=kernel_key(name), created_at=utcnow())
        s.execute(ins.on_conflict_do_nothing(index_elements=["name_key"]))
        return int(s.execute(select(Kernel.id).where(kernel_named(name))).scalar_one())

    def _case_id(self, s: Session, kernel_id: int, axes: dict[str, Any], work: float | None) -> int:
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

    def _key_ids(self, s: Session, kernel: str, axes: dict[str, Any], work: float | None,
                 device: str, info: dict[str, Any] | None) -> tuple[int, int, int]:
        """(kernel_id, case_id, device_id), the rows created where missing."""
        kernel_id = self._kernel_id(s, kernel)
        return kernel_id, self._case_id(s, kernel_id, axes, work), self._device_id(s, device, info)
