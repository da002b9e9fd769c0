"""Best records per (kernel, case, device), their history and the nearest-case lookup
(`interfaces.RecordRepository`)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timezone
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from kernelsearch.kernels.configs import canonical
from kernelsearch.kernels.resolve import nearest

from ..checks import axes_key, check_int
from ..errors import NotFound
from ..models import Case, Counter, Device, Kernel, Record, TrialSummary, utcnow, kernel_named
from ..statuses import RecordOrigin
from ..views import (RECORD_COLUMNS, VIEW_COLUMNS, Accepted, RecordIn, RecordView, Withdrawal,
                     accepted_value)
from ..wire import validated_record
from ._base import RepoBase, rowcount


def _fingerprint(r: RecordIn, *, as_given: bool = False) -> str:
    """Hash of what a record measured, its config in canonical form (`as_given`: as written, the
    hash of records stored before); equal for the same record exported and re-imported."""
    body = {
        "kernel": r.kernel,
        "axes": axes_key(r.axes),
        "device": r.device,
        "torch": r.torch_version,
        "triton": r.triton_version,
        "source": r.source_hash,
        "config": r.config if as_given else canonical(r.config),
        "lat": [r.latency_median_us, r.latency_min_us, r.latency_max_us, r.latency_iqr_us],
        "method": r.timing_method,
        "rel_error": r.rel_error,
        "tuned_at": r.tuned_at.astimezone(timezone.utc).isoformat(timespec="microseconds"),
    }
    if r.config_timings:  # absent before per-config timings: older fingerprints stay as they were
        body["timings"] = r.config_timings
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def rank(origin: str, latency_median_us: float) -> tuple[bool, float]:
    """A record's standing on its key, lowest first: a record measured by this deployment (a
    worker's, or imported from one) before any upload, then the faster median. So an upload
    never outranks a worker's record, and a worker's record replaces an upload."""
    return origin == RecordOrigin.UPLOAD, latency_median_us


# The references (and the speedups over them) a re-import may give a record stored without them.
_REFERENCE_COLUMNS = ("eager_latency_us", "compile_latency_us", "speedup_eager", "speedup_compile")


class RecordRepo(RepoBase):
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
        return RecordView(kernel=kernel, axes=dict(axes), work=work, device=device,
                          **{c: getattr(r, c) for c in VIEW_COLUMNS})

    def _load_record(self, s: Session, record_id: int) -> RecordView:
        return self._record_view(s.execute(self._records_query().where(Record.id == record_id)).one())

    def _upsert_locked(self, s: Session, rec: RecordIn) -> tuple[int, bool, bool, bool]:
        """Store rec under the records lock. Returns (id, became_current, superseded_one, new).
        A record is identified by its config's canonical form (kernels.configs), so the same
        config spelt two ways (key order, a launch default left out) is one record."""
        fp = _fingerprint(rec)
        # Records stored before the canonical fingerprint carry the hash of the config as given.
        fps = {fp, _fingerprint(rec, as_given=True)}
        existing = s.execute(select(Record.id).where(Record.fingerprint.in_(fps))).scalars().first()
        if existing is not None:
            return existing, False, False, False
        kernel_id, case_id, device_id = self._key_ids(s, rec.kernel, rec.axes, rec.work,
                                                      rec.device, rec.device_info)
        current = s.execute(
            select(Record.id, Record.latency_median_us, Record.origin, Record.config,
                   Record.config_timings).where(
                Record.case_id == case_id, Record.device_id == device_id, Record.is_current.is_(True)
            )
        ).first()
        mine = rank(rec.origin, rec.latency_median_us)
        theirs = None if current is None else rank(current.origin, current.latency_median_us)
        better = current is None or theirs is None or mine < theirs or (
            # the same winner, measured against more configs (a decorator's list grew)
            mine == theirs and canonical(rec.config) == canonical(current.config)
            and set(rec.config_timings or {}) > set(current.config_timings or {}))
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
            **{c: getattr(rec, c) for c in RECORD_COLUMNS},
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
        kernel_id, case_id, device_id = self._key_ids(s, rec.kernel, rec.axes, rec.work,
                                                      rec.device, rec.device_info)
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
        for col in _REFERENCE_COLUMNS:
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
            filled |= bool(rowcount(res))
        return filled

    def upsert_best(self, rec: Accepted[RecordIn]) -> tuple[RecordView, bool]:
        """Store a record the acceptance gate passed (TypeError for anything else); True when it became the current best (it ranks before the current one,
        see `rank`: an upload never replaces another origin's record, otherwise a strictly faster
        median wins; or the first for its key). Otherwise it is kept as history only. Storing the
        identical record again changes nothing and returns (existing, False)."""
        plain = validated_record(accepted_value(rec, "rec", RecordIn))

        def tx(s: Session) -> tuple[RecordView, bool]:
            self._lock_counter(s, "records")
            rid, improved, _, new = self._upsert_locked(s, plain)
            self._add_trials_locked(s, plain)
            if new:
                self._bump(s, "records")
            return self._load_record(s, rid), improved

        return self._tx(tx, write=True)

    def find_best(
        self, kernel: str, device: str, axes: dict[str, Any],
        distance: Callable[[dict[str, Any], float], float],
    ) -> tuple[RecordView, str] | None:
        """The current record for exactly these axes ("exact"), else the current record of the
        same kernel and device nearest to them ("nearest"). "Nearest" is the kernel's own
        definition (`KernelDef.distance`), passed as `distance(axes, work)` of a candidate (the
        query's own size is the caller's to know), where an infinite distance means never
        (another dtype, say): the store has none of its own."""
        key = axes_key(axes)
        if not callable(distance):
            raise ValueError(f"distance: expected a callable (axes, work) -> float, got {distance!r}")

        def q(s: Session) -> tuple[RecordView, str] | None:
            base = self._records_query().where(
                kernel_named(kernel), Device.name == device, Record.is_current.is_(True)
            )
            row = s.execute(base.where(Case.axes_key == key)).first()
            if row is not None:
                return self._record_view(row), "exact"
            cands = s.execute(
                select(Case.id, Case.axes, Case.work)
                .join(Record, Record.case_id == Case.id)
                .join(Kernel, Kernel.id == Case.kernel_id)
                .join(Device, Device.id == Record.device_id)
                .where(kernel_named(kernel), Device.name == device,
                       Record.is_current.is_(True), Case.work.is_not(None))
            ).all()
            pick = nearest((distance(dict(ax), float(w)), ax, cid) for cid, ax, w in cands)
            if pick is None:
                return None
            row = s.execute(base.where(Case.id == pick[0])).first()
            return None if row is None else (self._record_view(row), "nearest")

        return self._tx(q, write=False)

    def list_records(
        self, kernel: str | None = None, device: str | None = None, include_history: bool = False
    ) -> list[RecordView]:
        """Records ordered by kernel, device, case work, then time."""

        def q(s: Session) -> list[RecordView]:
            stmt = self._records_query()
            if kernel is not None:
                stmt = stmt.where(kernel_named(kernel))
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
                .where(kernel_named(kernel), Device.name == device, Case.axes_key == key)
                .order_by(Record.tuned_at, Record.id)
            )
            return [self._record_view(r) for r in s.execute(stmt).all()]

        return self._tx(q, write=False)

    def reset_study(self, study_name: str) -> bool:
        """Forget one study: Optuna's trials (failed ones too, which a resumed study never runs
        again) and their summaries, so the key's next tune or search measures every config anew
        instead of answering from what it kept. False when Optuna had no such study."""
        import optuna

        from ..optuna_storage import open_optuna_storage

        def tx(s: Session) -> None:
            s.execute(delete(TrialSummary).where(TrialSummary.study_name == study_name)
                      .execution_options(synchronize_session=False))

        self._tx(tx, write=True)
        storage = open_optuna_storage(self.url)
        try:
            optuna.delete_study(study_name=study_name, storage=storage)
        except KeyError:
            return False
        finally:
            rdb = getattr(storage, "rdb", None)
            if rdb is not None:
                rdb.engine.dispose()
        return True

    def withdraw_record(self, record_id: int) -> Withdrawal:
        """Delete one record (NotFound when there is none). When it was current, the best of its
        key's history by `rank` is served in its place, or nothing when it had none; the records
        counter moves, so lookup caches drop what they kept. Its study is reset (`reset_study`):
        a withdrawn record stays withdrawn until a new measurement, never re-made from the
        trials that made it."""
        check_int(record_id, "record_id", minimum=1)

        def tx(s: Session) -> Withdrawal:
            self._lock_counter(s, "records")
            row = s.execute(self._records_query().where(Record.id == record_id)).first()
            if row is None:
                raise NotFound(f"record {record_id}: no such record")
            gone = self._record_view(row)
            key = s.execute(select(Record.case_id, Record.device_id)
                            .where(Record.id == record_id)).one()
            s.execute(update(Record).where(Record.superseded_by == record_id)
                      .values(superseded_by=None).execution_options(synchronize_session=False))
            s.execute(delete(Record).where(Record.id == record_id)
                      .execution_options(synchronize_session=False))
            rest = s.execute(select(Record.id, Record.origin, Record.latency_median_us,
                                    Record.is_current).where(
                Record.case_id == key.case_id, Record.device_id == key.device_id)).all()
            current = next((r for r in rest if r.is_current), None)
            if current is None and rest:
                current = min(rest, key=lambda r: (rank(r.origin, r.latency_median_us), r.id))
                s.execute(update(Record).where(Record.id == current.id)
                          .values(is_current=True, superseded_at=None, superseded_by=None)
                          .execution_options(synchronize_session=False))
            if current is not None:
                # History that pointed at the withdrawn record now points at the current one.
                s.execute(update(Record)
                          .where(Record.case_id == key.case_id, Record.device_id == key.device_id,
                                 Record.id != current.id, Record.superseded_by.is_(None))
                          .values(superseded_by=current.id)
                          .execution_options(synchronize_session=False))
            now_current = self._load_record(s, current.id) if current is not None else None
            self._bump(s, "records")
            return Withdrawal(gone, now_current)

        out = self._tx(tx, write=True)
        if out.withdrawn.study_name:
            self.reset_study(out.withdrawn.study_name)
        return out

    def records_version(self) -> int:
        """A number that changes whenever records change (for cache invalidation)."""

        def q(s: Session) -> int:
            v = s.execute(select(Counter.value).where(Counter.name == "records")).scalar_one_or_none()
            return int(v or 0)

        return self._tx(q, write=False)

    def has_records(self, kernel: str | None = None) -> bool:
        """True when at least one record is stored (used by `records import --if-empty`), of
        `kernel` when one is named (a definition with records is not replaced by another's)."""

        def q(s: Session) -> bool:
            stmt = select(Record.id)
            if kernel is not None:
                stmt = stmt.join(Kernel, Kernel.id == Record.kernel_id).where(Kernel.name == kernel)
            return s.execute(stmt.limit(1)).first() is not None

        return self._tx(q, write=False)
