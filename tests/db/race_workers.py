"""Functions run in forked processes by test_concurrency (module-level, as a Pool needs)."""
from __future__ import annotations

from trusted_records import trust_check, trusted

import os

import time

from helpers import make_record

from kernelsearch.db.interfaces import Lease
from kernelsearch.db.store import Store


def _wait(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def claim_all(url: str, owner: str, start_at: float) -> list[int]:
    """Claim and finish jobs until none is left; returns the ids this process got."""
    got: list[int] = []
    with Store(url) as store:
        store.ping()
        _wait(start_at)
        while (job := store.claim_job(owner, lease_seconds=3600)) is not None:
            got.append(job.id)
            store.finish_job(Lease.of(job), "succeeded")
    return got


def upsert_many(url: str, latencies: list[float], start_at: float) -> list[tuple[int, float, bool]]:
    """Store one record per latency for the same key; returns (id, latency, improved)."""
    out = []
    with Store(url) as store:
        store.ping()
        _wait(start_at)
        for lat in latencies:
            view, improved = store.upsert_best(trusted(make_record(lat, config={"lat": lat}, minutes=lat)))
            out.append((view.id, lat, improved))
    return out


def import_doc(url: str, doc: dict, start_at: float) -> tuple[int, int, int]:
    with Store(url) as store:
        store.ping()
        _wait(start_at)
        rep = store.import_records(doc, check=trust_check)
    return rep.added, rep.superseded, rep.unchanged


def create_limited(url: str, n: int, limit: int, start_at: float) -> int:
    """Try to queue n jobs under a queue limit; returns how many were accepted."""
    from kernelsearch.db.errors import Conflict

    ok = 0
    with Store(url) as store:
        store.ping()
        _wait(start_at)
        for i in range(n):
            try:  # distinct jobs (identical ones while one is queued are that one)
                store.create_job("k", [{"seq_len": 1 + i}, {"seq_len": os.getpid()}], 1, "tpe",
                                 max_queued=limit)
                ok += 1
            except Conflict:
                pass
    return ok
