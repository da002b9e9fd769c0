"""Record provenance and withdrawal in the store, on both backends: an upload never outranks a
worker's (or an import's) record, a withdrawn record gives its place to the best of its history,
and a tuned_at whose UTC offset overflows is a ValueError naming the field, not an OverflowError."""
from __future__ import annotations

from trusted_records import trust_check, trusted

import dataclasses
import json
from datetime import datetime

import pytest
from helpers import make_record

from kernelsearch.db.engine import upgrade
from kernelsearch.db.errors import NotFound
from kernelsearch.db.store import Store
from kernelsearch.db.wire import parse_records_doc
from kernelsearch.db.wire import InvalidRecord


def upload(latency: float, **kw):
    return make_record(latency, origin="upload", uploaded_by="anonymous", uploaded_from="laptop", **kw)


def test_an_upload_never_supersedes_a_worker_record(store: Store) -> None:
    worker, _ = store.upsert_best(trusted(make_record(10.0)))
    faster, improved = store.upsert_best(trusted(upload(1.0, minutes=1)))
    assert not improved and not faster.is_current and faster.superseded_by == worker.id
    (cur,) = store.list_records()
    assert cur.id == worker.id and cur.origin == "worker"


def test_uploads_compete_and_a_measured_record_replaces_them(store: Store) -> None:
    first, ok = store.upsert_best(trusted(upload(10.0)))
    assert ok
    second, ok = store.upsert_best(trusted(upload(8.0, minutes=1)))
    assert ok and (second.uploaded_by, second.uploaded_from) == ("anonymous", "laptop")
    slower, ok = store.upsert_best(trusted(upload(9.0, minutes=2)))
    assert not ok
    imported, ok = store.upsert_best(trusted(make_record(12.0, minutes=3, origin="import")))
    assert ok, "an import (a deployment's measurement) replaces an upload even when slower"
    assert [r.id for r in store.list_records()] == [imported.id]


def test_withdrawing_the_current_record_serves_the_best_of_its_history(store: Store) -> None:
    slow_worker, _ = store.upsert_best(trusted(make_record(20.0)))
    up, _ = store.upsert_best(trusted(upload(5.0, minutes=1)))  # history: never over the worker
    fast_worker, _ = store.upsert_best(trusted(make_record(10.0, minutes=2)))
    version = store.records_version()
    got = store.withdraw_record(fast_worker.id)
    assert got.withdrawn.id == fast_worker.id
    assert got.now_current is not None and got.now_current.id == slow_worker.id, \
        "a worker's record ranks before a faster upload"
    assert store.records_version() > version
    hist = {r.id: r for r in store.list_records(include_history=True)}
    assert set(hist) == {slow_worker.id, up.id}
    assert hist[slow_worker.id].is_current and hist[slow_worker.id].superseded_by is None
    assert hist[up.id].superseded_by == slow_worker.id
    # Then the upload, then nothing.
    assert store.withdraw_record(slow_worker.id).now_current.id == up.id  # type: ignore[union-attr]
    assert store.withdraw_record(up.id).now_current is None
    assert store.list_records(include_history=True) == []
    with pytest.raises(NotFound, match=f"record {up.id}"):
        store.withdraw_record(up.id)
    with pytest.raises(ValueError, match="record_id"):
        store.withdraw_record(0)


def test_withdrawing_history_leaves_the_current_record(store: Store) -> None:
    old, _ = store.upsert_best(trusted(make_record(20.0)))
    new, _ = store.upsert_best(trusted(make_record(10.0, minutes=1)))
    got = store.withdraw_record(old.id)
    assert got.now_current is not None and got.now_current.id == new.id
    assert [r.id for r in store.list_records(include_history=True)] == [new.id]


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"])
def test_a_tuned_at_that_overflows_in_utc_names_the_field(store: Store, when: str) -> None:
    rec = dataclasses.replace(make_record(5.0), tuned_at=datetime.fromisoformat(when))
    with pytest.raises(InvalidRecord) as e:
        store.upsert_best(trusted(rec))
    assert e.value.field == "tuned_at"
    doc = json.loads(json.dumps(store.export_records()))
    entry = {**dataclasses.asdict(make_record(5.0)), "tuned_at": when}
    doc["records"] = [entry]
    with pytest.raises(Exception, match=r"records\[0\]\.tuned_at") as err:
        parse_records_doc(doc)
    assert not isinstance(err.value, OverflowError)


def test_provenance_survives_export_and_import(store: Store, make_db_url) -> None:
    store.upsert_best(trusted(upload(5.0)))
    doc = json.loads(json.dumps(store.export_records()))
    assert doc["records"][0]["origin"] == "upload"
    url = make_db_url("sqlite")
    upgrade(url)
    with Store(url) as other:
        other.import_records(doc, check=trust_check)
        (got,) = other.list_records()
    assert (got.origin, got.uploaded_by, got.uploaded_from) == ("upload", "anonymous", "laptop")
    # A file that does not say where its records came from holds imports.
    del doc["records"][0]["origin"]
    (rec,) = parse_records_doc(doc)
    assert rec.origin == "import"


def test_an_unknown_origin_is_refused(store: Store) -> None:
    with pytest.raises(InvalidRecord) as e:
        store.upsert_best(trusted(make_record(5.0, origin="admin")))
    assert e.value.field == "origin"
