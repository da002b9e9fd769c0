"""A cached /v1/best answer is served whatever PostgreSQL does (refusing connections, or
hanging mid-stream), marked stale; a miss is a 503 with Retry-After. The database sits behind
a TCP proxy this test cuts and pauses (the shared server itself is never touched)."""
from __future__ import annotations

from trusted_records import trusted

import asyncio
import threading

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import make_url

from svc_record import a_record
from tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

KERNEL = "vision_rope3d_spatial_merge_bwd"
DEVICE = "NVIDIA H200"


class PausingProxy(TcpProxy):
    """TcpProxy that can also hold every byte in flight (a stalled network or server)."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.flowing = threading.Event()
        self.flowing.set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while not self.flowing.is_set():
                    await asyncio.sleep(0.02)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def test_cache_hits_outlive_a_refusing_and_a_hung_database(pg_url, monkeypatch):
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store
    from kernelsearch.service.api import create_app
    from kernelsearch.service.lookups import BestCache
    from kernelsearch.service.settings import Settings

    upgrade(pg_url)
    with Store(pg_url) as st:
        st.upsert_best(trusted(a_record(KERNEL, {"seq_len": 128}, DEVICE)))
    url = make_url(pg_url)
    proxy = PausingProxy(url.host or "127.0.0.1", url.port or 5432).start()
    via = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    monkeypatch.setattr(BestCache, "STALE_S", 0.3)  # a hang longer than this: still served
    s = Settings(database_url=via, api_token=None, records_check_seconds=0.05,
                 lookup_timeout_s=1.0)
    hit = {"kernel": KERNEL, "device": DEVICE, "seq_len": 128}
    try:
        with TestClient(create_app(s)) as c:
            r = c.get("/v1/best", params=hit)
            assert r.status_code == 200 and r.headers["X-KS-Cache"] == "miss", r.text
            proxy.cut()  # refused
            seen = []
            for i in range(20):
                r = c.get("/v1/best", params=hit)
                assert r.status_code == 200, r.text
                assert r.json()["match"] == "exact"
                seen.append(r.headers["X-KS-Cache"])
                threading.Event().wait(0.02)
            # A check that began before the cut may still confirm the first answers (a loaded
            # machine): every answer is served, and the outage shows as stale ones.
            assert set(seen) <= {"hit", "stale"} and seen[-1] == "stale", seen
            r = c.get("/v1/best", params={**hit, "seq_len": 130})
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            proxy.restore()
            while c.get("/v1/best", params=hit).headers["X-KS-Cache"] != "hit":
                threading.Event().wait(0.05)
            proxy.flowing.clear()  # hung: connections stay open, nothing answers
            threading.Event().wait(0.6)
            for i in range(20):
                r = c.get("/v1/best", params=hit)
                assert r.status_code == 200, r.text
                assert r.headers["X-KS-Cache"] == "stale"
            r = c.get("/v1/best", params={**hit, "seq_len": 131})
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            proxy.flowing.set()
    finally:
        proxy.flowing.set()
        proxy.close()
