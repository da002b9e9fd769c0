"""Per-trial summaries of every study, for the dashboard and the failed-trial report
(`interfaces.TrialLog`)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import column, func, inspect, select, table
from sqlalchemy.orm import Session

from ..checks import axes_key, check_int, check_name
from ..models import Case, Device, Kernel, TrialSummary, utcnow, kernel_named
from ._base import RepoBase

# A stored trial's outcome as both listings show it.
_OUTCOME = ("state", "config", "latency_median_us", "failure_kind", "message")


def _outcome(t: TrialSummary) -> dict[str, Any]:
    return {"study_name": t.study_name, "trial_number": t.trial_number,
            **{c: getattr(t, c) for c in _OUTCOME}}


class TrialRepo(RepoBase):
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
        check_name(study_name, "study_name")
        check_name(kernel, "kernel")
        check_name(device, "device")
        check_name(state, "state")
        axes_key(axes)
        check_int(trial_number, "trial_number", minimum=0)
        if not isinstance(config, dict):
            raise ValueError(f"config: expected a dict, got {type(config).__name__}")
        check_int(job_id, "job_id", optional=True)

        def tx(s: Session) -> None:
            kernel_id, case_id, device_id = self._key_ids(s, kernel, axes, None, device, None)
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

    def count_job_trials(self) -> int:
        """How many trials tuning jobs have finished (summaries with a job), every worker's:
        /metrics reads it at scrape time, as a worker may run in another process or host."""
        return self._tx(lambda s: int(s.execute(select(func.count()).select_from(TrialSummary).where(
            TrialSummary.job_id.is_not(None))).scalar_one()), write=False)

    def trial_summaries(self, kernel: str, device: str, axes: dict[str, int]) -> list[dict[str, Any]]:
        """Trial outcomes of one key, in study then Optuna trial-number order."""
        key = axes_key(axes)

        def q(s: Session) -> list[dict[str, Any]]:
            rows = s.execute(
                select(TrialSummary)
                .join(Kernel, Kernel.id == TrialSummary.kernel_id)
                .join(Case, Case.id == TrialSummary.case_id)
                .join(Device, Device.id == TrialSummary.device_id)
                .where(kernel_named(kernel), Device.name == device, Case.axes_key == key)
                .order_by(TrialSummary.study_name, TrialSummary.trial_number)
            ).scalars()
            return [
                {
                    **_outcome(t),
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
        check_int(job_id, "job_id")

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
                {"kernel": kernel, "axes": dict(axes), "device": device, **_outcome(t), "job_id": t.job_id}
                for t, kernel, axes, device in rows
            ]

        return self._tx(q, write=False)

    def optuna_studies(self, names: list[str]) -> set[str]:
        """Which of `names` are studies in Optuna's storage in this database (its `studies`
        table): a record imported from elsewhere names a study that may not be here."""
        wanted = sorted({str(n) for n in names if n})
        if not wanted:
            return set()
        studies = table("studies", column("study_name"))

        def q(s: Session) -> set[str]:
            if not inspect(s.connection()).has_table("studies"):
                return set()
            rows = s.execute(select(studies.c.study_name).where(studies.c.study_name.in_(wanted)))
            return {str(r[0]) for r in rows}

        return self._tx(q, write=False)
