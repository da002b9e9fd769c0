"""Every read route has a bound: a read the database does not answer within KS_READ_TIMEOUT_S
is a 503 with Retry-After, in threads of its own, so /healthz and cached lookups stay fast while
slow reads wait; the API's PostgreSQL connections carry a statement timeout."""
from __future__ import annotations

from trusted_records import trusted

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from svc_helpers import H200, KB, LiveServer, record, settings_for

from kernelsearch.db.engine import upgrade
from kernelsearch.db.store import Store
from kernelsearch.service.api import create_app

N_SLOW = 60


class HungReads:
    """A store whose job reads wait until `release` is set (a database that hangs on them);
    everything else passes through."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.release = threading.Event()
        self.entered = 0
        self._lock = threading.Lock()

    def _hang(self) -> None:
        with self._lock:
            self.entered += 1
        self.release.wait(60)

    def list_jobs(self, *a: Any, **kw: Any) -> Any:
        self._hang()
        return self._store.list_jobs(*a, **kw)

    def get_job(self, *a: Any, **kw: Any) -> Any:
        self._hang()
        return self._store.get_job(*a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_slow_reads_answer_503_and_never_block_health_or_cache_hits(sqlite_store: Store) -> None:
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 128}, 20.0)))
    hung = HungReads(sqlite_store)
    s = settings_for(sqlite_store.url, read_timeout_s=2.0, read_threads=4)
    hit = {"kernel": KB, "device": H200, "seq_len": 128}
    with LiveServer(create_app(s, store=hung)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert c.get("/v1/best", params=hit).headers["X-KS-Cache"] == "miss"

        def slow_read(i: int) -> httpx.Response:
            with httpx.Client(base_url=srv.url, timeout=60) as own:
                return own.get("/v1/jobs" if i % 2 else f"/v1/jobs/{i + 1}")

        try:
            with ThreadPoolExecutor(N_SLOW) as ex:
                futures = [ex.submit(slow_read, i) for i in range(N_SLOW)]
                while hung.entered < s.read_threads:  # the slow reads hold their threads now
                    threading.Event().wait(0.01)
                health = c.get("/healthz")
                assert health.status_code == 200, health.text  # not "degraded": no wait
                cached = c.get("/v1/best", params=hit)
                assert cached.status_code == 200 and cached.headers["X-KS-Cache"] == "hit"
                slow = [f.result() for f in futures]
        finally:
            hung.release.set()
        assert {r.status_code for r in slow} == {503}
        assert all(r.headers["Retry-After"] and "KS_READ_TIMEOUT_S" in r.json()["detail"]
                   for r in slow)
        assert c.get("/v1/jobs").status_code == 200  # released: reads answer again


@pytest.mark.postgres
def test_a_locked_jobs_table_is_a_bounded_503_on_postgres(pg_url: str) -> None:
    upgrade(pg_url)
    with Store(pg_url) as st:
        st.create_job(KB, [{"seq_len": 2}], 1, "tpe")
    s = settings_for(pg_url, read_timeout_s=0.5, statement_timeout_s=3)
    locker = create_engine(pg_url, poolclass=NullPool)
    with TestClient(create_app(s)) as c:
        with c.app.state.store.engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "3s"
        assert c.get("/v1/jobs").status_code == 200
        with locker.connect() as conn, conn.begin():
            conn.execute(text("LOCK TABLE ks_jobs IN ACCESS EXCLUSIVE MODE"))
            for path in ("/v1/jobs", "/v1/jobs/1", "/"):
                r = c.get(path)
                assert r.status_code == 503, (path, r.text)
                assert r.headers["Retry-After"], path
        assert c.get("/v1/jobs/1").status_code == 200
    locker.dispose()
