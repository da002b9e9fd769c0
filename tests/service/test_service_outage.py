"""Database unreachable: 503 with a message on every route that needs it (a cached lookup
answers, marked stale), then recovery."""
from __future__ import annotations

from trusted_records import trusted

import time
from pathlib import Path

from fastapi.testclient import TestClient
from svc_helpers import H200, KB, free_port, record, settings_for

from kernelsearch.db.store import Store
from kernelsearch.service.api import create_app

HIT = f"/v1/best?kernel={KB}&device=x&seq_len=4"
DB_ROUTES = ("/healthz", "/v1/records", "/v1/jobs", "/v1/jobs/1", "/", "/metrics",
             f"/v1/best?kernel={KB}&device=x&seq_len=5")


def test_sqlite_outage_503_then_recovers(sqlite_store: Store) -> None:
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 4}, 5.0, device="x")))
    s = settings_for(sqlite_store.url, records_check_seconds=0.05)
    path = Path(sqlite_store.engine.url.database)
    with TestClient(create_app(s, store=sqlite_store)) as c:
        assert c.get("/healthz").status_code == 200
        r = c.get(HIT)  # cached from here on
        assert r.status_code == 200 and r.headers["X-KS-Cache"] == "miss"
        sqlite_store.engine.dispose()
        moved = path.with_suffix(".away")
        path.rename(moved)
        path.mkdir()  # a folder where the file was: SQLite cannot open it
        try:
            time.sleep(0.1)
            for route in DB_ROUTES[:-2]:
                r = c.get(route)
                assert r.status_code == 503, (route, r.status_code, r.text)
                assert "database unavailable" in r.text, route
            r = c.get(DB_ROUTES[-1])  # a miss
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            for _ in range(3):  # a hit answers from the cache, saying it could not check it
                r = c.get(HIT)
                assert r.status_code == 200, r.text
                assert r.json()["config"] and r.headers["X-KS-Cache"] == "stale"
            r = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1})
            assert r.status_code == 503
            assert c.get("/v1/kernels").status_code == 200  # needs no database
            assert "ks_database_up 0.0" in c.get("/metrics").text
        finally:
            path.rmdir()
            moved.rename(path)
            sqlite_store.engine.dispose()
        time.sleep(0.1)
        assert c.get("/healthz").status_code == 200
        r = c.get(HIT)
        assert r.json()["match"] == "exact" and r.headers["X-KS-Cache"] == "hit"


def test_postgres_unreachable_at_start_answers_503_without_secrets() -> None:
    url = f"postgresql+psycopg://ks:hunter2@127.0.0.1:{free_port()}/ks"
    store = Store(url)
    with TestClient(create_app(settings_for(url), store=store)) as c:
        for route in DB_ROUTES[:-2] + DB_ROUTES[-1:]:
            r = c.get(route)
            assert r.status_code == 503, (route, r.text)
            assert "hunter2" not in r.text
        body = c.get("/healthz").json()
        assert body["status"] == "unavailable" and body["detail"]
        assert c.get("/v1/best", params={"kernel": KB, "device": H200,
                                         "seq_len": 1}).status_code == 503
