"""PostgreSQL unreachable: the real API process answers 503 with a message on /healthz and on
the routes that need the database, never leaks the database password, and recovers by itself;
a worker process rides the outage out and tunes a job afterwards.

The outage is a TCP proxy this test controls in front of the shared PostgreSQL server (stopping
the server itself would break every other test using it)."""
from __future__ import annotations

from trusted_records import trusted

import secrets
import time

import httpx
import pytest
from sqlalchemy import make_url

from ks_stack import Stack, free_port, wait_healthy, wait_job
from tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(420)]

KERNEL = "vision_rope3d_spatial_merge_bwd"


def _until(pred, timeout: float, what: str, stack: Stack):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{stack.logs()}"
        time.sleep(0.2)


def test_api_and_worker_survive_a_database_outage(pg_url, tmp_path):
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store

    from svc_record import a_record

    upgrade(pg_url)
    with Store(pg_url) as store:
        store.upsert_best(trusted(a_record(KERNEL, {"seq_len": 128}, "NVIDIA H200")))

    real = make_url(pg_url)
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432).start()
    password = "pw-" + secrets.token_hex(8)  # trust auth ignores it; it must never be shown
    via_proxy = real.set(host="127.0.0.1", port=proxy.port, password=password)
    token = secrets.token_urlsafe(12)
    stack = Stack(tmp_path, {
        "KS_DATABASE_URL": via_proxy.render_as_string(hide_password=False),
        "KS_API_TOKEN": token, "KS_API_HOST": "127.0.0.1", "KS_API_PORT": str(free_port()),
        "KS_MEASURE_N": "2", "KS_TUNE_REFERENCE": "none", "KS_WORKER_POLL_S": "0.5",
        "KS_RECORDS_CHECK_S": "0.2",
    })
    base = f"http://127.0.0.1:{stack.env['KS_API_PORT']}"
    best_q = {"kernel": KERNEL, "device": "NVIDIA H200", "seq_len": 128}
    auth = {"Authorization": f"Bearer {token}"}
    try:
        api = stack.start("api")
        worker = stack.start("worker")
        wait_healthy(base, api)
        with httpx.Client(base_url=base, timeout=30) as c:
            assert c.get("/v1/best", params=best_q).status_code == 200

            proxy.cut()
            r = _until(lambda: (x := c.get("/healthz")).status_code == 503 and x, 30,
                       "/healthz to say 503", stack)
            assert r.json()["detail"] and "database" in r.text.lower()
            for method, path, kw in (("GET", "/v1/records", {}), ("GET", "/v1/jobs", {}),
                                     ("POST", "/v1/jobs", {"json": {"kernel": KERNEL, "cases": [{"seq_len": 2}],
                                                                    "n_trials": 1}, "headers": auth})):
                r = c.request(method, path, **kw)
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert r.json()["detail"], path
                assert password not in r.text
            assert c.get("/v1/kernels").status_code == 200, "routes without the database still answer"
            time.sleep(2)  # the worker polls into the outage a few times
            assert api.alive() and worker.alive(), stack.logs()

            proxy.restore()
            _until(lambda: c.get("/healthz").status_code == 200, 60, "/healthz to recover", stack)
            assert c.get("/v1/best", params=best_q).json()["match"] == "exact"
            r = c.post("/v1/jobs", headers=auth,
                       json={"kernel": KERNEL, "cases": [{"seq_len": 2}], "n_trials": 1})
            assert r.status_code == 202, r.text
            wait_job(c, r.json()["id"], stack, timeout=300)
        for proc in (api, worker):
            log = proc.tail(1_000_000)
            assert password not in log and token not in log, f"{proc.name} logged a secret"
    finally:
        stack.close()
        proxy.close()
