"""The job queue with its leases (`interfaces.JobQueue`) and the study claims workers hold while
they tune (`interfaces.StudyClaims`): a heartbeat renews both, a release gives both back.

Leases are fenced: a claim increments the job's attempt number, the lease's token, and every
write under a lease checks that token in the same statement or transaction, so a worker whose
lease lapsed (a partition, a stall) and was claimed again writes nothing when it resumes."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy import case as sa_case
from sqlalchemy.orm import Session

from ..checks import axes_key, check_int, check_name, check_number, check_status
from ..errors import Conflict, LeaseLost
from ..interfaces import Lease
from ..models import Job, Kernel, StudyClaim, utcnow, kernel_named
from ..statuses import ACTIVE_STATUSES, FINISHED_STATUSES, JobKind, JobStatus, job_kind
from ..views import JobView
from ._base import RepoBase, hold_job, lease_lost, rowcount


# KS_JOB_MAX_CLAIMS's default: a job whose worker went silent this many times is failed.
DEFAULT_MAX_CLAIMS = 3


def lost_claims_error(max_claims: int) -> str:
    """The error of a job failed at its claim cap."""
    return (f"failed after {max_claims} claims whose worker went silent past its lease (died or "
            f"hung) each time (KS_JOB_MAX_CLAIMS={max_claims}): the job may kill the process "
            f"that runs it; look at the workers' logs, fix the kernel, and submit it again")


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
            status=JobStatus(job.status),
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
            capture=job.capture,
            kind=JobKind(job.kind),
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
        capture: dict[str, Any] | None = None,
    ) -> JobView:
        """Queue a job (or return the identical one already queued or running); Conflict when
        `max_queued` jobs are already waiting."""
        return self.queue_job(kernel, cases, n_trials, sampler, timeout_s, max_queued, capture)[0]

    def queue_job(
        self,
        kernel: str,
        cases: list[dict[str, int]],
        n_trials: int,
        sampler: str,
        timeout_s: float | None = None,
        max_queued: int | None = None,
        capture: dict[str, Any] | None = None,
        failed_backoff_s: float | None = None,
    ) -> tuple[JobView, bool]:
        """`create_job`, and whether the job is an identical one already queued or running
        (True) rather than a new one: the API says which it answers. `capture`: the call an
        undeclared kernel's job tunes on (a job with one is identical only to another with one).
        `failed_backoff_s`: an identical job that failed less than this long ago is answered
        instead of a new one, so a call no worker can tune is not queued again on every miss."""
        check_name(kernel, "kernel")
        check_name(sampler, "sampler")
        if not isinstance(cases, list) or not cases:
            raise ValueError("cases: expected a non-empty list of axes dicts")
        for i, c in enumerate(cases):
            axes_key(c, arg=f"cases[{i}]")
        check_int(n_trials, "n_trials", minimum=1)
        check_number(timeout_s, "timeout_s", positive=True, optional=True)
        check_int(max_queued, "max_queued", minimum=0, optional=True)
        check_number(failed_backoff_s, "failed_backoff_s", optional=True)
        if failed_backoff_s is not None and failed_backoff_s < 0:
            raise ValueError(f"failed_backoff_s: expected seconds >= 0, got {failed_backoff_s}")
        if capture is not None and not isinstance(capture, dict):
            raise ValueError(f"capture: expected an object, got {type(capture).__name__}")

        wanted = [axes_key(c) for c in cases]
        limit_s = float(timeout_s) if timeout_s is not None else None
        kind = job_kind(sampler, capture)

        def tx(s: Session) -> tuple[JobView, bool]:
            self._lock_counter(s, "jobs")
            # A job asking for work an identical job already queued or running will do is that
            # job: twenty identical submits spend the budget once (a job adds n_trials to each
            # of its cases' studies, so a duplicate would add them again).
            kid = self._kernel_id(s, kernel)

            def identical(same: Job) -> bool:
                return (same.timeout_s == limit_s and same.kind == kind
                        and [axes_key(dict(c)) for c in same.cases] == wanted)

            for same in s.execute(
                select(Job).where(Job.kernel_id == kid, Job.status.in_(ACTIVE_STATUSES),
                                  Job.n_trials == n_trials, Job.sampler == sampler)
                .order_by(Job.id)
            ).scalars():
                if identical(same):
                    return self._job_view(same, kernel), True
            if failed_backoff_s:
                since = utcnow() - timedelta(seconds=failed_backoff_s)
                for same in s.execute(
                    select(Job).where(Job.kernel_id == kid, Job.status == JobStatus.FAILED,
                                      Job.finished_at >= since, Job.n_trials == n_trials,
                                      Job.sampler == sampler)
                    .order_by(Job.id.desc())
                ).scalars():
                    if identical(same):
                        return self._job_view(same, kernel), True
            if max_queued is not None:
                queued = s.execute(select(func.count()).where(Job.status == JobStatus.QUEUED)).scalar_one()
                if queued >= max_queued:
                    raise Conflict(
                        f"{queued} jobs are already queued (limit {max_queued}); "
                        "wait for some to finish or cancel them"
                    )
            job = Job(
                kernel_id=kid,
                kind=kind,
                cases=[dict(c) for c in cases],
                n_trials=n_trials,
                sampler=sampler,
                timeout_s=limit_s,
                status=JobStatus.QUEUED,
                trials_done=0,
                attempts=0,
                created_at=utcnow(),
                capture=dict(capture) if capture is not None else None,
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
                cond.append(kernel_named(kernel))
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

    def claim_job(self, owner: str, lease_seconds: float,
                  max_claims: int = DEFAULT_MAX_CLAIMS) -> JobView | None:
        """Take the oldest queued job, or a running one whose heartbeat is older than the lease.

        Taking a running job over counts a lost claim (its holder went silent: died or hung); a
        job that has lost `max_claims` claims is failed, in the same transaction, instead of
        claimed again, so a job that kills what runs it fails alone. The cap is in the UPDATE's
        own WHERE: concurrent claimers on either backend never take a capped job."""
        check_name(owner, "owner")
        check_number(lease_seconds, "lease_seconds", positive=True)
        check_int(max_claims, "max_claims", minimum=1)

        def tx(s: Session) -> JobView | None:
            now = utcnow()
            cutoff = now - timedelta(seconds=float(lease_seconds))
            silent = and_(Job.status == JobStatus.RUNNING,
                          or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < cutoff))
            s.execute(
                update(Job)
                .where(silent, Job.lost_claims + 1 >= max_claims)
                .values(status=JobStatus.FAILED, finished_at=now, lost_claims=Job.lost_claims + 1,
                        error=lost_claims_error(max_claims))
                .execution_options(synchronize_session=False)
            )
            claimable = or_(Job.status == JobStatus.QUEUED,
                            and_(silent, Job.lost_claims + 1 < max_claims))
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
                    status=JobStatus.RUNNING,
                    owner=owner,
                    heartbeat_at=now,
                    started_at=func.coalesce(Job.started_at, now),
                    attempts=Job.attempts + 1,
                    lost_claims=Job.lost_claims + sa_case((Job.status == JobStatus.RUNNING, 1), else_=0),
                )
                .returning(Job.id)
                .execution_options(synchronize_session=False)
            )
            job_id = s.execute(stmt).scalar_one_or_none()
            return None if job_id is None else self._load_job(s, job_id)

        return self._tx(tx, write=True)

    def _held(self, lease: Lease) -> Any:
        """The job row while `lease` holds it: running, and claimed by no one since."""
        return and_(Job.id == lease.job_id, Job.attempts == lease.token, Job.owner == lease.owner,
                    Job.status == JobStatus.RUNNING)

    def _write_held(self, s: Session, lease: Lease, values: dict[str, Any]) -> None:
        """The UPDATE of a job `lease` holds, checked in its own WHERE: LeaseLost, and nothing
        changed, once the job was claimed again, cancelled or finished."""
        res = s.execute(update(Job).where(self._held(lease)).values(values)
                        .execution_options(synchronize_session=False))
        if rowcount(res) != 1:
            raise lease_lost(s, lease)

    @staticmethod
    def _claims_of(lease: Lease) -> Any:
        return and_(StudyClaim.job_id == lease.job_id, StudyClaim.job_attempt == lease.token,
                    StudyClaim.owner == lease.owner)

    def heartbeat(self, lease: Lease) -> None:
        """Renew the lease and the study claims taken under it; LeaseLost when the job was
        cancelled, finished or claimed by another."""
        now = utcnow()

        def tx(s: Session) -> None:
            self._write_held(s, lease, {"heartbeat_at": now})
            s.execute(update(StudyClaim).where(self._claims_of(lease))
                      .values(heartbeat_at=now).execution_options(synchronize_session=False))

        self._tx(tx, write=True)

    def release_job(self, lease: Lease) -> None:
        """Hand a running job back to the queue at once (a worker told to stop), keeping its
        progress, and its study claims with it; LeaseLost when it was cancelled, finished or
        re-claimed meanwhile."""

        def tx(s: Session) -> None:
            self._write_held(s, lease, {"status": JobStatus.QUEUED, "owner": None, "heartbeat_at": None})
            s.execute(delete(StudyClaim).where(self._claims_of(lease)))

        self._tx(tx, write=True)

    def update_job_progress(
        self,
        lease: Lease,
        *,
        trials_done: int,
        device: str | None = None,
        best: dict[str, Any] | None = None,
        current_case: dict[str, Any] | None = None,
    ) -> None:
        """Record progress (and renew the lease); LeaseLost when the lease is no longer held."""
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
        self._tx(lambda s: self._write_held(s, lease, values), write=True)

    def keep_cancelled_best(self, lease: Lease, *, trials_done: int, best: dict[str, Any]) -> bool:
        """The summary of a case a job's worker finished after the job was cancelled (the
        case's record is stored, so the job reports it); only the worker whose lease the job
        was cancelled under writes it. False when the job is not that cancelled job."""
        check_int(trials_done, "trials_done", minimum=0)
        stmt = (update(Job)
                .where(Job.id == lease.job_id, Job.owner == lease.owner,
                       Job.attempts == lease.token, Job.status == JobStatus.CANCELLED)
                .values(best=best, trials_done=sa_case((Job.trials_done > trials_done, Job.trials_done),
                                                       else_=trials_done))
                .execution_options(synchronize_session=False))
        return self._tx(lambda s: rowcount(s.execute(stmt)) == 1, write=True)

    def finish_job(self, lease: Lease, status: JobStatus, error: str | None = None) -> None:
        """Close a job `lease` holds; LeaseLost when it was cancelled or re-claimed meanwhile."""
        check_status(status, "status", FINISHED_STATUSES)
        values = {"status": status, "error": error, "finished_at": utcnow()}
        self._tx(lambda s: self._write_held(s, lease, values), write=True)

    def cancel_job(self, job_id: int) -> JobView | None:
        """queued/running -> cancelled; a finished job is returned unchanged; None if unknown."""

        def tx(s: Session) -> JobView | None:
            s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(ACTIVE_STATUSES))
                .values(status=JobStatus.CANCELLED, finished_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return self._load_job(s, job_id)

        return self._tx(tx, write=True)

    # -- study claims ----------------------------------------------------------------

    def claim_study(self, study_name: str, lease: Lease, lease_seconds: float) -> str | None:
        """Take the study under `lease`; None when taken (or already ours), else the owner that
        holds it now. A claim older than `lease_seconds` (its worker died or hung) is taken over.
        LeaseLost when `lease` no longer holds its job."""
        check_name(study_name, "study_name")
        check_name(lease.owner, "owner")
        check_number(lease_seconds, "lease_seconds", positive=True)

        def tx(s: Session) -> str | None:
            hold_job(s, lease)
            now = utcnow()
            cutoff = now - timedelta(seconds=float(lease_seconds))
            mine = {"owner": lease.owner, "job_id": lease.job_id, "job_attempt": lease.token,
                    "heartbeat_at": now}
            ins = self._insert(s, StudyClaim).values(study_name=study_name, **mine)
            s.execute(ins.on_conflict_do_nothing(index_elements=["study_name"]))
            taken = rowcount(s.execute(
                update(StudyClaim)
                .where(StudyClaim.study_name == study_name,
                       or_(self._claims_of(lease), StudyClaim.heartbeat_at < cutoff))
                .values(mine)
                .execution_options(synchronize_session=False)
            ))
            if taken:
                return None
            return s.execute(select(StudyClaim.owner)
                             .where(StudyClaim.study_name == study_name)).scalar_one_or_none()

        return self._tx(tx, write=True)

    def release_study(self, study_name: str, lease: Lease) -> None:
        """Give a study back once its case is done (or left); a claim taken over since is not
        ours and stays."""
        self._tx(lambda s: s.execute(delete(StudyClaim).where(
            StudyClaim.study_name == study_name, self._claims_of(lease))), write=True)

    def check_study_claim(self, session: Any, study_name: str, lease: Lease) -> None:
        """Raise LeaseLost unless `lease` holds the study's claim. Run inside another writer's
        transaction on this database (the tuner's Optuna storage), so that writer's change and
        this check commit together: on PostgreSQL the claim row is share-locked until that
        transaction ends (a takeover waits for it); on SQLite the writer's transaction already
        holds the database's write lock."""
        held = session.execute(
            select(StudyClaim.study_name)
            .where(StudyClaim.study_name == study_name, self._claims_of(lease))
            .with_for_update(read=True)
        ).first()
        if held is None:
            holder = session.execute(select(StudyClaim.owner, StudyClaim.job_id, StudyClaim.job_attempt)
                                     .where(StudyClaim.study_name == study_name)).first()
            now = ("released" if holder is None else
                   f"held by {holder.owner} for job {holder.job_id}, attempt {holder.job_attempt}")
            raise LeaseLost(f"study {study_name}: no longer claimed under job {lease.job_id}'s "
                            f"lease of attempt {lease.token} ({lease.owner}): {now}")
