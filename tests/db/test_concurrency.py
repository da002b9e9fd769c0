"""Races between several real processes (forked) on SQLite and PostgreSQL.

The racers are forked, not spawned: a spawned child re-imported torch and Triton through the
tests' helpers (~2.6 s each, four at once on two cores) before it could race. Each child opens
its own Store (its own engine and connections); none touches the parent's."""
from __future__ import annotations

from trusted_records import trusted

import multiprocessing
import random
import time
from collections import Counter

import race_workers
from helpers import DEVICE, KERNEL, make_record, nearest_to

from kernelsearch.db.engine import upgrade
from kernelsearch.db.store import Store

N_PROCS = 4
# Forked children import nothing; each connects (store.ping) and then waits for this moment, so
# all of them start their first write together.
START_DELAY_S = 0.5


def _race(fn, args_per_proc: list[tuple]) -> list:
    ctx = multiprocessing.get_context("fork")
    start_at = time.time() + START_DELAY_S
    with ctx.Pool(len(args_per_proc)) as pool:
        return pool.starmap(fn, [(*a, start_at) for a in args_per_proc], chunksize=1)


def test_no_job_is_claimed_twice(store: Store) -> None:
    ids = [store.create_job(KERNEL, [{"total_patches": i + 1}], 1, "tpe").id for i in range(40)]
    results = _race(race_workers.claim_all, [(store.url, f"w{i}") for i in range(N_PROCS)])
    claimed = [j for r in results for j in r]
    assert Counter(claimed).most_common(1)[0][1] == 1, "a job was claimed twice"
    assert sorted(claimed) == ids
    jobs = store.list_jobs(limit=100)
    assert all(j.status == "succeeded" and j.attempts == 1 for j in jobs)


def test_concurrent_upserts_keep_the_best_record(store: Store) -> None:
    lats = [round(random.uniform(1.0, 100.0), 6) for _ in range(N_PROCS * 8)]
    assert len(set(lats)) == len(lats)
    chunks = [lats[i::N_PROCS] for i in range(N_PROCS)]
    v0 = store.records_version()
    results = [x for r in _race(race_workers.upsert_many, [(store.url, c) for c in chunks]) for x in r]

    history = store.record_history(KERNEL, DEVICE, {"total_patches": 64})
    assert len(history) == len(lats), "every result is kept"
    current = [r for r in history if r.is_current]
    assert len(current) == 1 and current[0].latency_median_us == min(lats)
    axes = {"total_patches": 64}
    assert store.find_best(KERNEL, DEVICE, axes, nearest_to(axes))[0].id == current[0].id
    by_id = {r.id: r for r in history}
    improved_ids = {rid for rid, _, imp in results if imp}
    assert current[0].id in improved_ids
    for r in history:
        if not r.is_current:
            # Whatever superseded it (or beat it on arrival) is strictly faster.
            assert r.superseded_by is not None and by_id[r.superseded_by].latency_median_us < r.latency_median_us
    assert store.records_version() - v0 == len(lats)


def test_concurrent_imports_of_one_file_store_it_once(store: Store, make_db_url) -> None:
    for i, lat in enumerate([9.0, 7.0, 8.0, 3.0]):
        store.upsert_best(trusted(make_record(lat, axes={"total_patches": 64 * (1 + i % 2)}, minutes=i, config={"i": i})))
    doc = store.export_records(include_history=True)
    target = make_db_url("postgres" if store.engine.dialect.name == "postgresql" else "sqlite")
    upgrade(target)
    results = _race(race_workers.import_doc, [(target, doc)] * N_PROCS)
    assert sum(r[0] for r in results) == len(doc["records"]), "each entry added exactly once"
    assert all(r[0] in (0, len(doc["records"])) for r in results), "each import is all or nothing"
    with Store(target) as t:
        got = sorted((r.latency_median_us, r.is_current) for r in t.list_records(include_history=True))
    want = sorted((r.latency_median_us, r.is_current) for r in store.list_records(include_history=True))
    assert got == want


def test_queue_limit_holds_under_concurrent_submits(store: Store) -> None:
    accepted = _race(race_workers.create_limited, [(store.url, 5, 7)] * N_PROCS)
    assert sum(accepted) == 7
    assert store.count_jobs("queued") == 7
