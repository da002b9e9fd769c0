"""The store's side of issue 16, on SQLite and PostgreSQL: study claims, handing a job back,
trials_done that never goes backwards, retries of transient failures only, and which errors
count as transient."""
from __future__ import annotations

import time

import pytest
from helpers import KERNEL
from sqlalchemy import exc, select

from kernelsearch.db.engine import is_transient, retrying
from kernelsearch.db.errors import LeaseLost, SchemaBehind, StoreUnavailable
from kernelsearch.db.interfaces import Lease
from kernelsearch.db.models import StudyClaim
from kernelsearch.db.store import Store

CASES = [{"total_patches": 64}]


def _lease(store: Store, owner: str, lease_seconds: float = 60) -> Lease:
    """A job claimed by `owner` (a new one queued first when none is claimable)."""
    job = store.claim_job(owner, lease_seconds)
    if job is None:
        store.create_job(KERNEL, CASES, 3 + len(store.list_jobs()), "tpe")
        job = store.claim_job(owner, lease_seconds)
    return Lease.of(job)


def test_a_study_is_claimed_by_one_owner_until_released_or_stale(store: Store) -> None:
    w1, w2, w3 = (_lease(store, w) for w in ("w1", "w2", "w3"))
    assert store.claim_study("ks/s", w1, lease_seconds=60) is None
    assert store.claim_study("ks/s", w1, lease_seconds=60) is None, "ours again"
    assert store.claim_study("ks/s", w2, lease_seconds=60) == "w1"
    store.release_study("ks/s", w2)  # not w2's: nothing happens
    assert store.claim_study("ks/s", w2, lease_seconds=60) == "w1"
    store.release_study("ks/s", w1)
    assert store.claim_study("ks/s", w2, lease_seconds=60) is None
    time.sleep(0.05)
    assert store.claim_study("ks/s", w3, lease_seconds=0.01) is None, "a stale claim is taken over"
    assert store.claim_study("ks/s", w2, lease_seconds=60) == "w3"


def test_heartbeat_renews_the_claims_of_its_lease(store: Store) -> None:
    lease = _lease(store, "w1")
    assert store.claim_study("ks/s", lease, lease_seconds=60) is None

    def claimed_at() -> object:
        with store.engine.connect() as conn:
            return conn.execute(select(StudyClaim.heartbeat_at)).scalar_one()

    first = claimed_at()
    time.sleep(0.05)
    store.heartbeat(lease)
    assert claimed_at() > first, "renewed with the job's lease"


def test_heartbeat_renews_the_jobs_lease(store: Store) -> None:
    """A heartbeat moves the lease on: a lease shorter than the time since the claim would let
    another worker take the job, but not the time since the heartbeat."""
    job = store.create_job(KERNEL, CASES, 3, "tpe")
    claimed = store.claim_job("w1", lease_seconds=60)
    assert claimed is not None and claimed.id == job.id
    time.sleep(0.3)
    store.heartbeat(Lease.of(claimed))
    renewed = store.get_job(job.id)
    assert renewed.heartbeat_at > claimed.heartbeat_at
    assert store.claim_job("w2", lease_seconds=0.2) is None, "renewed, so not stale"
    time.sleep(0.3)
    taken = store.claim_job("w2", lease_seconds=0.2)
    assert taken is not None and (taken.id, taken.owner) == (job.id, "w2"), "stale without one"


def test_release_job_requeues_at_once_keeping_progress(store: Store) -> None:
    lease = _lease(store, "w1")
    store.claim_study("ks/s", lease, lease_seconds=60)
    store.update_job_progress(lease, trials_done=2)
    with pytest.raises(LeaseLost):
        store.release_job(Lease(lease.job_id, "w2", lease.token))  # only the holder hands it back
    store.release_job(lease)
    back = store.get_job(lease.job_id)
    assert (back.status, back.owner, back.heartbeat_at, back.trials_done) == ("queued", None, None, 2)
    again = Lease.of(store.claim_job("w2", lease_seconds=60))
    assert again.job_id == lease.job_id and again.token == 2
    assert store.claim_study("ks/s", again, lease_seconds=60) is None, "its claims went with it"
    store.cancel_job(lease.job_id)
    with pytest.raises(LeaseLost, match="cancelled"):
        store.release_job(again)
    assert store.get_job(lease.job_id).status == "cancelled"


def test_trials_done_never_goes_backwards(store: Store) -> None:
    lease = _lease(store, "w1")
    store.update_job_progress(lease, trials_done=7)
    store.update_job_progress(lease, trials_done=6)  # a takeover recounting
    assert store.get_job(lease.job_id).trials_done == 7
    store.update_job_progress(lease, trials_done=8)
    assert store.get_job(lease.job_id).trials_done == 8


def test_transient_failures_are_retried_and_others_are_not(store: Store) -> None:
    calls = {"n": 0}

    def flaky(_s):
        calls["n"] += 1
        if calls["n"] < 3:
            raise exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))
        return "ok"

    patient = Store.from_engine(store.engine)
    patient.retry_s = 10
    assert patient._tx(flaky, write=False) == "ok" and calls["n"] == 3

    calls["n"] = 0
    with pytest.raises(StoreUnavailable):
        store._tx(flaky, write=False)  # retry_s=0: the lookup path answers at once
    assert calls["n"] == 1

    def bad(_s):
        calls["n"] += 1
        raise exc.ProgrammingError("SELEC 1", {}, Exception("syntax error"))

    calls["n"] = 0
    with pytest.raises(exc.ProgrammingError):
        patient._tx(bad, write=False)
    assert calls["n"] == 1, "a bad statement is not retried"


def test_is_transient_follows_wrapped_causes() -> None:
    dropped = exc.OperationalError("x", {}, Exception("connection reset"))
    assert is_transient(dropped) and is_transient(StoreUnavailable("down"))
    assert is_transient(exc.PendingRollbackError("invalid transaction"))

    class StorageInternalError(Exception):  # Optuna's shape: the driver error as its cause
        pass

    wrapped = StorageInternalError("An exception is raised during the commit")
    wrapped.__cause__ = dropped
    assert is_transient(wrapped)
    invalid = StorageInternalError("exceeding max length")
    invalid.__cause__ = exc.DataError("x", {}, Exception("value too long"))
    assert not is_transient(invalid)
    assert not is_transient(SchemaBehind("run kernelsearch db upgrade"))
    assert not is_transient(ValueError("a kernel's own failure"))
    missing = exc.OperationalError("x", {}, Exception("no such table: ks_jobs"))
    assert not is_transient(missing)


def test_retrying_gives_up_after_its_budget() -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise StoreUnavailable("down")

    with pytest.raises(StoreUnavailable, match="down"):
        retrying(0.5)(down)
    assert len(calls) >= 2, "retried before giving up"


def test_claim_study_names_a_bad_argument(store: Store) -> None:
    lease = _lease(store, "w1")
    with pytest.raises(ValueError, match="lease_seconds"):
        store.claim_study("ks/s", lease, lease_seconds=0)
    with pytest.raises(ValueError, match="owner"):
        store.claim_study("ks/s", Lease(lease.job_id, "", lease.token), lease_seconds=1)
