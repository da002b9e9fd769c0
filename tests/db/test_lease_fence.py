"""Fenced leases at the repository level, on SQLite and PostgreSQL: once a job is claimed again,
every write made under the old lease (job progress, heartbeat, finish, hand-back, study claims,
trial summaries and records through `under_lease`, and the check the tuner runs inside Optuna's
writes) raises LeaseLost and changes nothing, even when the new holder has the same owner name
(a worker restarted with the same KS_WORKER_ID while the old one hung)."""
from __future__ import annotations

from trusted_records import trusted

import time
from typing import Any

import pytest
from helpers import DEVICE, KERNEL, make_record
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelsearch.db.errors import LeaseLost
from kernelsearch.db.interfaces import Lease
from kernelsearch.db.models import StudyClaim
from kernelsearch.db.store import Store

AXES = {"total_patches": 64}
STUDY = "ks/fence"


def _state(store: Store, job_id: int) -> dict[str, Any]:
    """Everything a write under a lease could change."""
    with Session(store.engine) as s:
        claims = [tuple(r) for r in s.execute(select(
            StudyClaim.study_name, StudyClaim.owner, StudyClaim.job_id, StudyClaim.job_attempt,
            StudyClaim.heartbeat_at))]
    return {"job": store.get_job(job_id).as_dict(), "claims": claims,
            "trials": store.trial_numbers(STUDY),
            "records": [r.id for r in store.list_records(include_history=True)]}


def _take_over(store: Store, new_owner: str) -> tuple[Lease, Lease]:
    job = store.create_job(KERNEL, [AXES], 4, "random")
    old = Lease.of(store.claim_job("w1", lease_seconds=60))
    assert old.job_id == job.id and store.claim_study(STUDY, old, lease_seconds=60) is None
    store.update_job_progress(old, trials_done=1)
    time.sleep(0.05)
    # The old holder stops heartbeating (a partition); its lease and claim go stale.
    new = Lease.of(store.claim_job(new_owner, lease_seconds=0.01))
    assert new.job_id == job.id and new.token == old.token + 1
    assert store.claim_study(STUDY, new, lease_seconds=0.01) is None
    store.update_job_progress(new, trials_done=1)
    return old, new


@pytest.mark.parametrize("new_owner", ["w2", "w1"])
def test_every_write_under_an_old_lease_is_refused_and_changes_nothing(store: Store, new_owner: str) -> None:
    old, new = _take_over(store, new_owner)
    before = _state(store, old.job_id)
    stale = store.under_lease(old)
    writes = {
        "heartbeat": lambda: store.heartbeat(old),
        "progress": lambda: store.update_job_progress(old, trials_done=3, best={"x": 1}),
        "finish": lambda: store.finish_job(old, "failed", error="stale"),
        "hand back": lambda: store.release_job(old),
        "claim study": lambda: store.claim_study(STUDY, old, lease_seconds=0.01),
        "trial summary": lambda: stale.add_trial_summary(
            STUDY, KERNEL, DEVICE, AXES, 7, "complete", {"BLOCK_P": 32}, 1.0, None, None,
            job_id=old.job_id),
        "record": lambda: stale.upsert_best(trusted(make_record(1.0, job_id=old.job_id))),
        "device": lambda: stale.ensure_device({"name": "stale device"}),
    }
    for name, write in writes.items():
        with pytest.raises(LeaseLost, match=f"job {old.job_id}"):
            write()
        assert _state(store, old.job_id) == before, f"{name} under the old lease changed something"
    store.release_study(STUDY, old)  # giving back a claim that is not ours: a no-op
    assert _state(store, old.job_id) == before

    # The check the tuner runs in each of Optuna's write transactions on the study.
    with Session(store.engine) as s:
        with pytest.raises(LeaseLost, match=f"held by {new_owner}"):
            store.check_study_claim(s, STUDY, old)
        store.check_study_claim(s, STUDY, new)

    # The new holder writes as before, and finishes the job.
    store.heartbeat(new)
    store.under_lease(new).add_trial_summary(STUDY, KERNEL, DEVICE, AXES, 7, "complete",
                                             {"BLOCK_P": 32}, 1.0, None, None, job_id=new.job_id)
    store.finish_job(new, "succeeded")
    job = store.get_job(new.job_id)
    assert (job.status, job.owner, job.attempts, job.trials_done) == ("succeeded", new_owner, 2, 1)


def test_a_lease_no_one_claimed_since_still_writes(store: Store) -> None:
    """A lease that lapsed but was not claimed again still holds the job: a worker whose
    heartbeats were late resumes as if nothing happened."""
    store.create_job(KERNEL, [AXES], 4, "random")
    lease = Lease.of(store.claim_job("w1", lease_seconds=60))
    store.claim_study(STUDY, lease, lease_seconds=60)
    time.sleep(0.05)
    assert store.claim_job("w2", lease_seconds=60) is None
    store.heartbeat(lease)
    store.under_lease(lease).upsert_best(trusted(make_record(2.0, job_id=lease.job_id)))
    with Session(store.engine) as s:
        store.check_study_claim(s, STUDY, lease)
    store.finish_job(lease, "succeeded")
    assert store.get_job(lease.job_id).status == "succeeded"


def test_a_claim_from_before_the_fence_matches_no_lease(store: Store) -> None:
    """A claim row without an attempt (held while upgrading to 0004) is no one's: it goes
    stale and is taken over, and no write passes its check meanwhile."""
    store.create_job(KERNEL, [AXES], 4, "random")
    lease = Lease.of(store.claim_job("w1", lease_seconds=60))
    with Session(store.engine) as s, s.begin():
        s.add(StudyClaim(study_name=STUDY, owner="w1", job_id=lease.job_id, job_attempt=None,
                         heartbeat_at=store.get_job(lease.job_id).heartbeat_at))
    with Session(store.engine) as s, pytest.raises(LeaseLost):
        store.check_study_claim(s, STUDY, lease)
    assert store.claim_study(STUDY, lease, lease_seconds=60) == "w1", "held, not stale yet"
    time.sleep(0.05)
    assert store.claim_study(STUDY, lease, lease_seconds=0.01) is None
    with Session(store.engine) as s:
        store.check_study_claim(s, STUDY, lease)
