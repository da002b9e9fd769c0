"""The job queue with its leases (`interfaces.JobQueue`) and the study claims workers hold while
they tune (`interfaces.StudyClaims`): a heartbeat renews both, a release gives both back."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy import case as sa_case
from sqlalchemy.orm import Session

from ..checks import axes_key, check_int, check_name, check_number, check_status
from ..errors import Conflict
from ..models import Job, Kernel, StudyClaim, utcnow
from ..statuses import ACTIVE_STATUSES, FINISHED_STATUSES
from ..views import JobView
from ._base import RepoBase, rowcount


class JobRepo(RepoBase):
    @staticmethod
    def _job_view(job: Job, kernel: str) -> JobView:
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
        return self.queue_job(kernel, cases, n_trials, sampler, timeout_s, max_queued)[0]

    def queue_job(
        self,
        kernel: str,
        cases: list[dict[str, int]],
        n_trials: int,
        sampler: str,
        timeout_s: float | None = None,
        max_queued: int | None = None,
    ) -> tuple[JobView, bool]:
        """`create_job`, and whether the job is an identical one already queued or running
        (True) rather than a new one: the API says which it answers."""
        check_name(kernel, "kernel")
        check_name(sampler, "sampler")
        if not isinstance(cases, list) or not cases:
            raise ValueError("cases: expected a non-empty list of axes dicts")
        for i, c in enumerate(cases):
            axes_key(c, arg=f"cases[{i}]")
        check_int(n_trials, "n_trials", minimum=1)
        check_number(timeout_s, "timeout_s", positive=True, optional=True)
        check_int(max_queued, "max_queued", minimum=0, optional=True)

        wanted = [axes_key(c) for c in cases]
        limit_s = float(timeout_s) if timeout_s is not None else None

        def tx(s: Session) -> tuple[JobView, bool]:
            self._lock_counter(s, "jobs")
            # A job asking for work an identical job already queued or running will do is that
            # job: twenty identical submits spend the budget once (a job adds n_trials to each
            # of its cases' studies, so a duplicate would add them again).
            kid = self._kernel_id(s, kernel)
            for same in s.execute(
                select(Job).where(Job.kernel_id == kid, Job.status.in_(ACTIVE_STATUSES),
                                  Job.n_trials == n_trials, Job.sampler == sampler)
                .order_by(Job.id)
            ).scalars():
                if same.timeout_s == limit_s and [axes_key(dict(c)) for c in same.cases] == wanted:
                    return self._job_view(same, kernel), True
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
                timeout_s=limit_s,
                status="queued",
                trials_done=0,
                attempts=0,
                created_at=utcnow(),
            )
            s.add(job)
            s.flush()
            self._bump(s, "jobs")
            return self._job_view(job, kernel), False

        return self._tx(tx, write=True)

    def get_job(self, job_id: int) -> JobView | None:
        return self._tx(lambda s: self._load_job(s, job_id), write=False)

    def list_jobs(self, status: str | None = None, limit: int = 100) -> list[JobView]:
        """Newest first."""
        check_status(status, "status")
        check_int(limit, "limit", minimum=1)

        def q(s: Session) -> list[JobView]:
            stmt = select(Job, Kernel.name).join(Kernel, Kernel.id == Job.kernel_id)
            if status is not None:
                stmt = stmt.where(Job.status == status)
            rows = s.execute(stmt.order_by(Job.id.desc()).limit(limit)).all()
            return [self._job_view(j, k) for j, k in rows]

        return self._tx(q, write=False)

    def page_jobs(self, status: str | None = None, kernel: str | None = None, *,
                  offset: int = 0, limit: int = 50) -> tuple[list[JobView], int]:
        """One page of jobs, newest first, filtered by status and kernel; with how many match
        (the dashboard's jobs page)."""
        check_status(status, "status")
        check_int(offset, "offset", minimum=0)
        check_int(limit, "limit", minimum=1)

        def q(s: Session) -> tuple[list[JobView], int]:
            cond = []
            if status is not None:
                cond.append(Job.status == status)
            if kernel is not None:
                cond.append(Kernel.name == kernel)
            base = select(Job, Kernel.name).join(Kernel, Kernel.id == Job.kernel_id).where(*cond)
            total = s.execute(select(func.count()).select_from(base.subquery())).scalar_one()
            rows = s.execute(base.order_by(Job.id.desc()).offset(offset).limit(limit)).all()
            return [self._job_view(j, k) for j, k in rows], int(total)

        return self._tx(q, write=False)

    def count_jobs(self, status: str | None = None) -> int:
        check_status(status, "status")

        def q(s: Session) -> int:
            stmt = select(func.count()).select_from(Job)
            if status is not None:
                stmt = stmt.where(Job.status == status)
            return int(s.execute(stmt).scalar_one())

        return self._tx(q, write=False)

    def claim_job(self, owner: str, lease_seconds: float) -> JobView | None:
        """Take the oldest queued job, or a running one whose heartbeat is older than the lease."""
        check_name(owner, "owner")
        check_number(lease_seconds, "lease_seconds", positive=True)

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

    def _update_owned(self, job_id: int, owner: str, values: dict[str, Any]) -> Any:
        """The UPDATE of a running job we own (it changes nothing once the lease is lost)."""
        return (
            update(Job)
            .where(self._owned(job_id, owner))
            .values(values)
            .execution_options(synchronize_session=False)
        )

    def heartbeat(self, job_id: int, owner: str) -> bool:
        """Renew the lease (and the owner's study claims); False when the job was cancelled,
        finished or claimed by another."""
        now = utcnow()
        stmt = self._update_owned(job_id, owner, {"heartbeat_at": now})

        def tx(s: Session) -> bool:
            ours = rowcount(s.execute(stmt)) == 1
            if ours:
                s.execute(update(StudyClaim).where(StudyClaim.owner == owner)
                          .values(heartbeat_at=now).execution_options(synchronize_session=False))
            return ours

        return self._tx(tx, write=True)

    def release_job(self, job_id: int, owner: str) -> bool:
        """Hand a running job we own back to the queue at once (a worker told to stop), keeping
        its progress; False when it was cancelled, finished or re-claimed meanwhile."""
        stmt = self._update_owned(job_id, owner,
                                  {"status": "queued", "owner": None, "heartbeat_at": None})

        def tx(s: Session) -> bool:
            s.execute(delete(StudyClaim).where(StudyClaim.owner == owner))
            return rowcount(s.execute(stmt)) == 1

        return self._tx(tx, write=True)

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
        check_int(trials_done, "trials_done", minimum=0)
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
        stmt = self._update_owned(job_id, owner, values)
        return self._tx(lambda s: rowcount(s.execute(stmt)) == 1, write=True)

    def keep_cancelled_best(self, job_id: int, owner: str, *, trials_done: int,
                            best: dict[str, Any]) -> bool:
        """The summary of a case a job's worker finished after the job was cancelled (the
        case's record is stored, so the job reports it); only the worker that held the job
        writes it. False when the job is not a cancelled job of `owner`."""
        check_int(trials_done, "trials_done", minimum=0)
        stmt = (update(Job)
                .where(Job.id == job_id, Job.owner == owner, Job.status == "cancelled")
                .values(best=best, trials_done=sa_case((Job.trials_done > trials_done, Job.trials_done),
                                                       else_=trials_done))
                .execution_options(synchronize_session=False))
        return self._tx(lambda s: rowcount(s.execute(stmt)) == 1, write=True)

    def finish_job(self, job_id: int, owner: str, status: str, error: str | None = None) -> bool:
        """Close a job we own; False when it was cancelled or re-claimed meanwhile."""
        check_status(status, "status", FINISHED_STATUSES)
        stmt = self._update_owned(job_id, owner,
                                  {"status": status, "error": error, "finished_at": utcnow()})
        return self._tx(lambda s: rowcount(s.execute(stmt)) == 1, write=True)

    def cancel_job(self, job_id: int) -> JobView | None:
        """queued/running -> cancelled; a finished job is returned unchanged; None if unknown."""

        def tx(s: Session) -> JobView | None:
            s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(ACTIVE_STATUSES))
                .values(status="cancelled", finished_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return self._load_job(s, job_id)

        return self._tx(tx, write=True)

    # -- study claims ----------------------------------------------------------------

    def claim_study(self, study_name: str, owner: str, lease_seconds: float,
                    job_id: int | None = None) -> str | None:
        """Take the study for `owner`; None when taken (or already ours), else the owner that
        holds it now. A claim older than `lease_seconds` (its worker died) is taken over."""
        check_name(study_name, "study_name")
        check_name(owner, "owner")
        check_number(lease_seconds, "lease_seconds", positive=True)

        def tx(s: Session) -> str | None:
            now = utcnow()
            cutoff = now - timedelta(seconds=float(lease_seconds))
            ins = self._insert(s, StudyClaim).values(study_name=study_name, owner=owner,
                                                      job_id=job_id, heartbeat_at=now)
            s.execute(ins.on_conflict_do_nothing(index_elements=["study_name"]))
            taken = rowcount(s.execute(
                update(StudyClaim)
                .where(StudyClaim.study_name == study_name,
                       or_(StudyClaim.owner == owner, StudyClaim.heartbeat_at < cutoff))
                .values(owner=owner, job_id=job_id, heartbeat_at=now)
                .execution_options(synchronize_session=False)
            ))
            if taken:
                return None
            return s.execute(select(StudyClaim.owner)
                             .where(StudyClaim.study_name == study_name)).scalar_one_or_none()

        return self._tx(tx, write=True)

    def release_study(self, study_name: str, owner: str) -> None:
        """Give a study back once its case is done (or left)."""
        self._tx(lambda s: s.execute(delete(StudyClaim).where(
            StudyClaim.study_name == study_name, StudyClaim.owner == owner)), write=True)
