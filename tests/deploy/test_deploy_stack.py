"""The compose stack as real processes: migration, the API and two GPU workers, with exactly the
commands and environment docker-compose.yml gives them, on a private database (PostgreSQL when
KS_TEST_POSTGRES_URL is set, SQLite otherwise). A job submitted over HTTP is tuned by the
workers (under the Triton interpreter here) and its best config is served afterwards."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys

import httpx
import pytest

from ks_stack import ROOT, Stack, free_port, load_compose, wait_healthy, wait_job

pytestmark = pytest.mark.slow

KERNEL = "vision_rope3d_spatial_merge_bwd"


@pytest.fixture
def stack_db(request, tmp_path) -> str:
    """PostgreSQL (a private database) when configured, else an SQLite file."""
    if os.environ.get("KS_TEST_POSTGRES_URL"):
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'stack.db'}"


@pytest.fixture
def stack(stack_db, tmp_path):
    port = free_port()
    env = {
        "POSTGRES_PASSWORD": "unused-here",
        "KS_DATABASE_URL": stack_db,
        "KS_API_TOKEN": secrets.token_urlsafe(16),
        "KS_API_HOST": "127.0.0.1",
        "KS_API_PORT": str(port),
        "KS_MEASURE_N": "2",
        "KS_TUNE_REFERENCE": "none",
        "KS_WORKER_POLL_SECONDS": "0.5",
        "KS_HEARTBEAT_SECONDS": "1",
        "KS_LEASE_SECONDS": "30",
        "KS_TRIAL_TIMEOUT_S": "120",
    }
    s = Stack(tmp_path, env)
    yield s
    s.close()


def test_compose_stack_tunes_a_job_and_serves_it(stack):
    migrate = stack.run_once("migrate")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    api = stack.start("api")
    workers = [stack.start("worker", name=f"worker{i}") for i in (1, 2)]
    base = f"http://127.0.0.1:{stack.env['KS_API_PORT']}"
    health = wait_healthy(base, api)
    assert health["worker"] == "none", "the API runs without an embedded worker (--no-worker)"

    token = stack.env["KS_API_TOKEN"]
    auth = {"Authorization": f"Bearer {token}"}
    bodies = [{"kernel": KERNEL, "cases": [{"seq_len": n}], "n_trials": 2, "sampler": "random"}
              for n in (2, 3)]
    with httpx.Client(base_url=base, timeout=30) as client:
        assert client.post("/v1/jobs", json=bodies[0]).status_code == 401
        ids = []
        for body in bodies:
            r = client.post("/v1/jobs", json=body, headers=auth)
            assert r.status_code == 202, r.text
            assert r.json()["status"] == "queued"
            ids.append(r.json()["id"])
        jobs = [wait_job(client, job_id, stack, timeout=400) for job_id in ids]
        assert [j["trials_done"] for j in jobs] == [2, 2]
        assert all(w.alive() for w in workers), stack.logs()
        device = jobs[0]["device"]
        assert device

        for axes in ({"seq_len": 2}, {"seq_len": 3}):
            best = client.get("/v1/best", params={"kernel": KERNEL, "device": device, **axes})
            assert best.status_code == 200, best.text
            body = best.json()
            assert body["match"] == "exact" and body["case"] == axes
            assert body["config"] and body["latency_us"] > 0
        records = client.get("/v1/records", params={"kernel": KERNEL, "device": device}).json()
        assert sorted(r["case"]["seq_len"] for r in records) == [2, 3]

    # The compose healthchecks pass against the running processes: the compose file's own
    # `test` argv (`python -m kernelsearch.service.deploy.healthcheck ...`), run from the repository root as
    # the image runs it from /app.
    compose = load_compose()
    for service, extra in (("api", {"KS_API_PORT": stack.env["KS_API_PORT"]}),
                           ("worker", {"KS_DATABASE_URL": stack.env["KS_DATABASE_URL"]})):
        kind, exe, *args = compose["services"][service]["healthcheck"]["test"]
        assert kind == "CMD" and exe == "python", compose["services"][service]["healthcheck"]
        hc = subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, **extra},
                            capture_output=True, text=True, timeout=60)
        assert hc.returncode == 0, f"{service}: {hc.stdout}{hc.stderr}"

    # SIGTERM stops every process cleanly (compose's `docker stop`). Uvicorn re-raises the
    # signal after its graceful shutdown, so the API's status is -SIGTERM; the log says it ended.
    assert stack.stop(api) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in api.tail(), api.tail()
    for proc in workers:
        assert stack.stop(proc) == 0, f"{proc.name} did not stop cleanly:\n{proc.tail()}"
    for proc in [api, *workers]:
        assert stack.env["KS_API_TOKEN"] not in proc.tail(100_000), f"{proc.name} logged the token"
