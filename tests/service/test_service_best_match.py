"""/v1/best: match=exact|nearest, the distance of a nearest answer, a bound past which nothing is
served, a 404 naming the devices with records of this kernel, informational axes said to be
ignored; and the rough edges of input errors (the token before the body, query errors with their
errors list, a too-large integer, a float case axis) said plainly."""
from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from svc_helpers import H200, KA, KB, settings_for

from kernelsearch import kernels
from kernelsearch.service.api import create_app


def test_match_exact_and_nearest(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 128}, 20.0, config={"ROWS": 2})
    q = {"kernel": KB, "device": H200}
    b = client.get("/v1/best", params={**q, "seq_len": 128, "match": "exact"}).json()
    assert b["match"] == "exact" and b["distance"] == 0.0
    r = client.get("/v1/best", params={**q, "seq_len": 160, "match": "exact"})
    assert r.status_code == 404 and "exactly" in r.json()["detail"]
    b = client.get("/v1/best", params={**q, "seq_len": 160, "match": "nearest"}).json()
    k = kernels.get_kernel(KB)
    assert b["match"] == "nearest" and b["case"] == {"seq_len": 128}
    assert b["distance"] == pytest.approx(k.distance({"seq_len": 160}, {"seq_len": 128}), abs=1e-6)
    assert b["distance"] > 0
    r = client.get("/v1/best", params={**q, "seq_len": 128, "match": "closest"})
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["query", "match"]


def test_nothing_is_served_past_the_nearest_bound(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 16}, 2.0)
    q = {"kernel": KB, "device": H200}
    r = client.get("/v1/best", params={**q, "seq_len": 100000})
    assert r.status_code == 404, r.text
    assert "KS_NEAREST_MAX_RATIO" in r.json()["detail"] and "seq_len=16" in r.json()["detail"]
    k = kernels.get_kernel(KB)
    near = next(n for n in range(17, 100000)
                if math.exp(k.distance({"seq_len": n}, {"seq_len": 16})) > 4)
    assert client.get("/v1/best", params={**q, "seq_len": near}).json()["match"] == "nearest"


def test_404_lists_devices_with_records_of_this_kernel(client: TestClient, add_record) -> None:
    add_record(KB, {"seq_len": 128}, 20.0, device="NVIDIA A100")
    add_record(KA, {"total_patches": 256}, 5.0, device="NVIDIA L4")
    r = client.get("/v1/best", params={"kernel": KB, "device": "NVIDIA B200", "seq_len": 128})
    assert r.status_code == 404
    detail = r.json()["detail"]
    assert "'NVIDIA A100'" in detail and "NVIDIA L4" not in detail


def test_informational_axes_are_said_to_be_ignored(client: TestClient, add_record) -> None:
    add_record(KA, {"total_patches": 256}, 5.0)
    q = {"kernel": KA, "device": H200, "total_patches": 256}
    b = client.get("/v1/best", params={**q, "num_images": 4}).json()
    assert b["match"] == "exact" and b["ignored_axes"] == ["num_images"]
    assert "ignored_axes" not in client.get("/v1/best", params=q).json()


@pytest.fixture
def token_client(sqlite_store):
    app = create_app(settings_for(sqlite_store.url, api_token="tok", max_body_bytes=1000),
                     store=sqlite_store)
    with TestClient(app) as c:
        yield c


@pytest.mark.parametrize("body", [b"{not json", b'{"kernel": NaN}', b"x" * 5000,
                                  b'{"kernel": "k", "cases": [{"seq_len": 16.5}], "n_trials": 1}'])
def test_the_token_is_checked_before_the_body(token_client: TestClient, body: bytes) -> None:
    for path in ("/v1/jobs", "/v1/records", "/v1/jobs/1/cancel"):
        r = token_client.post(path, content=body, headers={"Content-Type": "application/json",
                                                           "Authorization": "Bearer wrong"})
        assert r.status_code == 401, (path, r.status_code, r.text)
        assert r.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("params, loc", [
    ({"kernel": KB, "device": H200, "seq_len": "abc"}, ["query", "seq_len"]),
    ({"kernel": KB, "device": H200}, ["query", "seq_len"]),
    ({"kernel": KB, "device": H200, "seq_len": 8, "color": "red"}, ["query", "color"]),
    ({"kernel": KA, "device": H200, "total_patches": 8, "num_images": "x"}, ["query", "num_images"]),
    ({"kernel": KB, "seq_len": 8}, ["query", "device"]),
    ({"kernel": KB, "device": "bad\x01name", "seq_len": 8}, ["query", "device"]),
])
def test_query_errors_carry_their_errors_list(sqlite_client: TestClient, params, loc) -> None:
    r = sqlite_client.get("/v1/best", params=params)
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert [e["loc"] for e in errors] == [loc] and errors[0]["msg"]


def test_a_too_large_integer_is_called_too_large(sqlite_client: TestClient) -> None:
    big = "9" * 30
    for path in (f"/v1/jobs/{big}", f"/v1/jobs?limit={big}",
                 f"/v1/best?kernel={KB}&device=x&seq_len={big}"):
        r = sqlite_client.get(path)
        assert r.status_code == 422, path
        detail = r.json()["detail"]
        assert "ASCII" not in detail and ("18 digits" in detail or "outside" in detail), detail


def test_a_float_case_axis_is_said_plainly(token_client: TestClient) -> None:
    r = token_client.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 16.5}],
                                            "n_trials": 1},
                          headers={"Authorization": "Bearer tok"})
    assert r.status_code == 422
    body = r.json()
    assert "union" not in body["detail"] and "literal" not in body["detail"], body["detail"]
    assert "16.5" in body["detail"] and "seq_len" in body["detail"]
    assert [e["loc"] for e in body["errors"]] == [["body", "cases", 0, "seq_len"]]
