"""Records files out and in (`interfaces.RecordTransfer`); the format itself is `db.wire`."""
from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..checks import axes_key
from ..statuses import TrialStatus
from ..models import Case, Device, Kernel, TrialSummary, utcnow
from ..views import ImportReport, RecordIn, Rejection, accepted_value
from ..wire import (EXPORT_MESSAGE_CHARS, EXPORT_SCHEMA, EXPORT_VERSION, TRIAL_STATES, EntryCheck,
                    accepted_records_doc)
from .kernels import KernelRepo
from .records import RecordRepo

_TrialsByKey = dict[tuple[str, str, str, str], list[dict[str, Any]]]


class TransferRepo(RecordRepo, KernelRepo):
    """Export and import ride on the records repository: an import stores each entry under the
    same rule as upsert_best."""

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
            d["trials"] = (trials.get((r.study_name, r.kernel, axes_key(r.axes), r.device), [])
                           if r.study_name else [])
            out.append(d)
        needed = {r.kernel for r in recs}
        defined = {name: d for name, d in self.kernel_definitions().items() if name in needed}
        return {
            "schema": EXPORT_SCHEMA,
            "version": EXPORT_VERSION,
            "exported_at": utcnow().isoformat(),
            "filters": {"kernel": kernel, "device": device, "include_history": include_history},
            # The undeclared kernels' definitions: an import into a store that never saw them
            # can gate and serve their records.
            "kernels": dict(sorted(defined.items())),
            "records": out,
        }

    def _export_trials(self, studies: set[str]) -> _TrialsByKey:
        """The trials of these studies as an export carries them, per (study, kernel, axes key,
        device), in trial-number order; messages cut to EXPORT_MESSAGE_CHARS."""
        if not studies:
            return {}

        def q(s: Session) -> _TrialsByKey:
            out: _TrialsByKey = {}
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
                        "latency_median_us": t.latency_median_us if state == TrialStatus.COMPLETE else None,
                        "failure_kind": t.failure_kind,
                        "message": msg,
                    })
            return out

        return self._tx(q, write=False)

    def import_records(self, doc: dict[str, Any], *, check: EntryCheck,
                       keep_going: bool = False) -> ImportReport:
        """Validate every entry and pass it through `check`, the acceptance gate
        (`search_space.acceptance.import_check`: only what it accepts is stored), then store them
        in one transaction. By default a bad entry rejects the whole document (ImportRejected, nothing
        stored); with `keep_going` the valid entries are stored and each bad one is listed in
        the report's `rejected`.

        Each entry goes through the same rule as upsert_best; entries already present are
        counted unchanged, so importing the same document twice changes nothing. The document's
        kernel definitions (`kernels`) are not stored here: the caller registers them first, so
        that `check` knows the kernels (service.cli_db).
        """
        rejected: list[Rejection] | None = [] if keep_going else None
        recs = [accepted_value(a, "check", RecordIn)
                for a in accepted_records_doc(doc, check=check, rejected=rejected)]

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
                                trials_added=trials, rejected=list(rejected or []))

        return self._tx(tx, write=True)
