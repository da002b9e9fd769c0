"""The REST contract: status codes, bodies and messages, on SQLite and PostgreSQL."""
from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from kernelsearch import kernels
from kernelsearch.db.errors import SchemaBehind
from kernelsearch.db.interfaces import Lease
from kernelsearch.db.store import Store
from kernelsearch.service.api import create_app

from svc_helpers import H200, KA, KB, settings_for


def test_healthz_ok(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert body["database"] in ("sqlite", "postgresql")
    assert body["worker"] == "none"


def test_kernels_and_cases(sqlite_client: TestClient) -> None:
    r = sqlite_client.get("/v1/kernels")
    assert r.status_code == 200
    assert {k["name"] for k in r.json()} == set(kernels.all_kernels())
    one = sqlite_client.get(f"/v1/kernels/{KA}").json()
    assert one["axes"][0]["name"] == "total_patches"
    assert "num_images" in one["extra_axes"]
    cases = sqlite_client.get(f"/v1/kernels/{KB}/cases").json()
    assert len(cases) == 16
    assert cases[0]["axes"] == kernels.get_kernel(KB).cases[0].axes
    assert cases[0]["bytes_moved"] == kernels.get_kernel(KB).bytes_moved(cases[0]["axes"])
    for path in ("/v1/kernels/nope", "/v1/kernels/nope/cases"):
        r = sqlite_client.get(path)
        assert r.status_code == 404
        assert "unknown kernel" in r.json()["detail"]


def test_best_exact_and_nearest(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 128}, 20.0, config={"ROWS": 2})
    add_record(KB, {"seq_len": 4096}, 300.0, config={"ROWS": 8})
    r = client.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": 128})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["match"] == "exact"
    assert b["case"] == {"seq_len": 128} and b["requested"] == {"seq_len": 128}
    assert b["config"] == {"ROWS": 2}
    assert b["latency_us"] == pytest.approx(20.0)
    assert b["roofline_pct"] == pytest.approx(50.0)
    assert b["same_versions"] is True
    assert b["tuned_at"] and b["versions"]["torch"]
    # No record at 3000 rows: the nearest in work is the 4096 one, not the 128 one.
    b = client.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": 3000}).json()
    assert b["match"] == "nearest"
    assert b["case"] == {"seq_len": 4096} and b["requested"] == {"seq_len": 3000}
    assert b["config"] == {"ROWS": 8}


def test_best_says_when_versions_differ(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 64}, 9.0, torch_version="0.0-other")
    b = client.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": 64}).json()
    assert b["same_versions"] is False
    assert b["versions"]["torch"] == "0.0-other"
    assert b["current_versions"]["torch"] != "0.0-other"


def test_best_extra_axes_accepted_for_kernel_a(client: TestClient, add_record) -> None:
    add_record(KA, {"total_patches": 256}, 5.0)
    r = client.get("/v1/best", params={"kernel": KA, "device": H200, "total_patches": 256,
                                       "num_images": 4, "max_grid_size": 16})
    assert r.status_code == 200 and r.json()["match"] == "exact"


def test_best_404_when_no_record_on_device(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 128}, 20.0)
    r = client.get("/v1/best", params={"kernel": KB, "device": "NVIDIA B200", "seq_len": 128})
    assert r.status_code == 404
    assert "NVIDIA B200" in r.json()["detail"] and H200 in r.json()["detail"]
    r = client.get("/v1/best", params={"kernel": "nope", "device": H200, "seq_len": 1})
    assert r.status_code == 404


@pytest.mark.parametrize("params, fragment", [
    ({"kernel": KB, "device": H200, "seq_len": -3}, "outside"),
    ({"kernel": KB, "device": H200, "seq_len": "abc"}, "integer"),
    ({"kernel": KB, "device": H200, "seq_len": "1.5"}, "integer"),
    ({"kernel": KB, "device": H200}, "missing axis"),
    ({"kernel": KB, "device": H200, "seq_len": 8, "color": "red"}, "unknown axis"),
    ({"kernel": KB, "device": H200, "seq_len": 8, "total_patches": 3}, "unknown axis"),
    ({"kernel": KA, "device": H200, "total_patches": 8, "num_images": "x"}, "positive integer"),
    ({"kernel": KB, "seq_len": 8}, "device"),
    ({"device": H200, "seq_len": 8}, "kernel"),
    ({"kernel": KB, "device": "bad\x00name", "seq_len": 8}, "device"),
])
def test_best_422(sqlite_client: TestClient, params: dict, fragment: str) -> None:
    r = sqlite_client.get("/v1/best", params=params)
    assert r.status_code == 422, r.text
    assert fragment in r.json()["detail"]


def test_best_rejects_a_repeated_axis(sqlite_client: TestClient) -> None:
    r = sqlite_client.get(f"/v1/best?kernel={KB}&device=x&seq_len=1&seq_len=2")
    assert r.status_code == 422 and "twice" in r.json()["detail"]


def test_best_cache_sees_other_writers(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 100}, 20.0)
    q = {"kernel": KB, "device": H200, "seq_len": 128}
    assert client.get("/v1/best", params=q).json()["match"] == "nearest"
    # Another process stores the exact case: the cache notices within records_check_seconds.
    add_record(KB, {"seq_len": 128}, 30.0)
    deadline = time.monotonic() + 5
    while client.get("/v1/best", params=q).json()["match"] != "exact":
        assert time.monotonic() < deadline, "cache never noticed the new record"
        time.sleep(0.02)


def test_records_listing(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 128}, 20.0)
    add_record(KA, {"total_patches": 256}, 5.0, device="Other GPU")
    rows = client.get("/v1/records").json()
    assert {(r["kernel"], r["device"]) for r in rows} == {(KB, H200), (KA, "Other GPU")}
    rows = client.get("/v1/records", params={"device": "Other GPU"}).json()
    assert [r["case"] for r in rows] == [{"total_patches": 256}]
    assert rows[0]["latency_us"] == pytest.approx(5.0)
    assert client.get("/v1/records", params={"kernel": "nope"}).status_code == 404


# -- jobs ---------------------------------------------------------------------------------------
def test_job_lifecycle(client: TestClient) -> None:
    r = client.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 2}, {"seq_len": 3}],
                                      "n_trials": 4, "sampler": "random", "timeout_s": 60})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] == "queued" and job["kernel"] == KB
    assert job["cases"] == [{"seq_len": 2}, {"seq_len": 3}]
    assert job["n_trials"] == 4 and job["trials_done"] == 0 and job["error"] is None
    got = client.get(f"/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["sampler"] == "random" and got["kind"] == "declared"
    assert [j["id"] for j in client.get("/v1/jobs").json()] == [job["id"]]
    assert client.get("/v1/jobs", params={"status": "running"}).json() == []
    r = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"


@pytest.mark.parametrize("ended", ["succeeded", "failed"])
def test_cancel_of_a_finished_job_is_a_conflict(client: TestClient, store: Store, ended: str) -> None:
    """Cancelling a job that already succeeded or failed answers 409 and leaves its status (a
    cancelled job cancelled again stays cancelled: 200)."""
    job = store.create_job(KB, [{"seq_len": 2}], 1, "random")
    claimed = store.claim_job("w", 60)
    assert claimed.id == job.id
    store.finish_job(Lease.of(claimed), ended)
    r = client.post(f"/v1/jobs/{job.id}/cancel")
    assert r.status_code == 409, r.text
    assert f"already {ended}" in r.json()["detail"]
    assert client.get(f"/v1/jobs/{job.id}").json()["status"] == ended


def test_job_all_cases(client: TestClient) -> None:
    r = client.post("/v1/jobs", json={"kernel": KA, "cases": "all", "n_trials": 1})
    assert r.status_code == 202
    assert r.json()["cases"] == [c.axes for c in kernels.get_kernel(KA).cases]


def test_unknown_job_404(sqlite_client: TestClient) -> None:
    assert sqlite_client.get("/v1/jobs/999999").status_code == 404
    assert sqlite_client.post("/v1/jobs/999999/cancel").status_code == 404
    assert sqlite_client.get("/v1/jobs/0").status_code == 422
    assert sqlite_client.get("/v1/jobs/99999999999999999999").status_code == 422


@pytest.mark.parametrize("body, status, fragment", [
    ({"kernel": "nope", "cases": "all", "n_trials": 1}, 404, "unknown kernel"),
    ({"kernel": KB, "cases": [{"seq_len": -3}], "n_trials": 1}, 422, "cases[0]"),
    ({"kernel": KB, "cases": [{"rows": 3}], "n_trials": 1}, 422, "unknown axis"),
    ({"kernel": KB, "cases": [], "n_trials": 1}, 422, "at least one"),
    ({"kernel": KB, "cases": "some", "n_trials": 1}, 422, ""),
    ({"kernel": KB, "cases": "all", "n_trials": 0}, 422, ""),
    ({"kernel": KB, "cases": "all", "n_trials": 5, "extra": 1}, 422, ""),
    ({"kernel": KB, "cases": "all", "n_trials": 5, "sampler": "magic"}, 422, "sampler"),
    ({"kernel": KB, "cases": "all", "n_trials": 5, "timeout_s": -1}, 422, ""),
    ({"cases": "all", "n_trials": 5}, 422, ""),
])
def test_job_invalid_bodies(sqlite_client: TestClient, body: dict, status: int, fragment: str) -> None:
    r = sqlite_client.post("/v1/jobs", json=body)
    assert r.status_code == status, r.text
    assert fragment in str(r.json()["detail"])


def test_job_malformed_json_and_content_type(sqlite_client: TestClient) -> None:
    r = sqlite_client.post("/v1/jobs", content=b'{"kernel": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    r = sqlite_client.post("/v1/jobs", content=b'{"kernel": "x", "cases": "all", "n_trials": 1}')
    assert r.status_code == 422


def test_job_limits(store) -> None:
    s = settings_for(store.url, max_trials_per_job=10, max_cases_per_job=2, max_queued_jobs=2)
    with TestClient(create_app(s, store=store)) as c:
        r = c.post("/v1/jobs", json={"kernel": KB, "cases": "all", "n_trials": 11})
        assert r.status_code == 422 and "KS_MAX_TRIALS_PER_JOB" in r.json()["detail"]
        r = c.post("/v1/jobs", json={"kernel": KB, "cases": "all", "n_trials": 1})
        assert r.status_code == 422 and "KS_MAX_CASES_PER_JOB" in r.json()["detail"]
        first = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1})
        assert first.status_code == 202 and first.json()["existing"] is False
        again = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1})
        assert again.status_code == 202 and again.json()["id"] == first.json()["id"]  # deduplicated
        assert again.json()["existing"] is True  # and says so
        assert c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 3}],
                                        "n_trials": 1}).status_code == 202
        r = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 4}], "n_trials": 1})
        assert r.status_code == 429 and "queued" in r.json()["detail"]


def test_body_size_limit(store) -> None:
    with TestClient(create_app(settings_for(store.url, max_body_bytes=200), store=store)) as c:
        cases = [{"seq_len": i} for i in range(1, 40)]
        r = c.post("/v1/jobs", json={"kernel": KB, "cases": cases, "n_trials": 1})
        assert r.status_code == 413 and "KS_MAX_BODY_BYTES" in r.json()["detail"]


def test_auth_for_writes(store) -> None:
    s = settings_for(store.url, api_token="s3cret-token")
    body = {"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1}
    with TestClient(create_app(s, store=store)) as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = c.post("/v1/jobs", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = c.post("/v1/jobs", json=body, headers={"Authorization": "Basic czNjcmV0LXRva2Vu"})
        assert r.status_code == 401
        r = c.post("/v1/jobs", json=body, headers={"Authorization": "Bearer s3cret-token"})
        assert r.status_code == 202
        job_id = r.json()["id"]
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 401
        assert c.get(f"/v1/jobs/{job_id}").status_code == 200  # reads stay open
        r = c.post(f"/v1/jobs/{job_id}/cancel", headers={"Authorization": "Bearer s3cret-token"})
        assert r.status_code == 200


def test_cors_off_by_default_and_on_when_configured(sqlite_store: Store) -> None:
    pre = {"Origin": "http://example.test", "Access-Control-Request-Method": "GET"}
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        r = c.get("/v1/kernels", headers={"Origin": "http://example.test"})
        assert "access-control-allow-origin" not in r.headers
        assert "access-control-allow-origin" not in c.options("/v1/kernels", headers=pre).headers
    s = settings_for(sqlite_store.url, cors_origins=["http://example.test"])
    with TestClient(create_app(s, store=sqlite_store)) as c:
        r = c.get("/v1/kernels", headers={"Origin": "http://example.test"})
        assert r.headers["access-control-allow-origin"] == "http://example.test"


def test_metrics(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 128}, 20.0)
    client.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": 128})
    client.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": 100})
    client.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'ks_lookups_total{match="exact"} 1.0' in text
    assert 'ks_lookups_total{match="nearest"} 1.0' in text
    assert 'ks_jobs{status="queued"} 1.0' in text
    assert "ks_lookup_seconds_bucket" in text and "ks_trials_total" in text


def test_openapi_documents_every_route(sqlite_client: TestClient) -> None:
    spec = sqlite_client.get("/openapi.json").json()
    for path in ("/healthz", "/v1/kernels", "/v1/kernels/{kernel}", "/v1/kernels/{kernel}/cases",
                 "/v1/best", "/v1/records", "/v1/jobs", "/v1/jobs/{job_id}",
                 "/v1/jobs/{job_id}/cancel", "/metrics"):
        assert path in spec["paths"], path
    names = {p["name"] for p in spec["paths"]["/v1/best"]["get"]["parameters"]}
    assert {"kernel", "device", "seq_len", "total_patches"} <= names


def test_refuses_to_start_on_an_old_schema(sqlite_url: str) -> None:
    from kernelsearch.db.store import Store

    app = create_app(settings_for(sqlite_url), store=Store(sqlite_url))
    with pytest.raises(SchemaBehind, match="kernelsearch db upgrade"):
        with TestClient(app):
            pass


def test_trials_of_any_worker_reach_metrics(store: Store) -> None:
    """ks_trials_total and ks_jobs_finished_total count what workers wrote to the database: the
    embedded worker is a child process (and others run elsewhere), so nothing counted in the
    API process would see them."""
    job = store.create_job(KB, [{"seq_len": 2}], 1, "random")
    for n in range(3):
        store.add_trial_summary("ks/x", KB, H200, {"seq_len": 2}, n, "complete",
                                {"BLOCK_D": 64}, 5.0, None, None, job_id=job.id)
    store.add_trial_summary("ks/x", KB, H200, {"seq_len": 2}, 3, "complete",
                            {"BLOCK_D": 64}, 5.0, None, None)  # a CLI tune's, not a job's
    store.cancel_job(job.id)
    with TestClient(create_app(settings_for(store.url), store=store)) as c:
        text = c.get("/metrics").text
    assert "ks_trials_total 3.0" in text
    assert 'ks_jobs_finished_total{status="cancelled"} 1.0' in text


def test_openapi_says_when_a_submit_answers_an_existing_job(sqlite_client: TestClient) -> None:
    spec = sqlite_client.get("/openapi.json").json()
    ok = spec["paths"]["/v1/jobs"]["post"]["responses"]["202"]["content"]["application/json"]["schema"]
    schema = spec["components"]["schemas"][ok["$ref"].rsplit("/", 1)[-1]]
    assert "existing" in schema["properties"] and "existing" in schema.get("required", [])
