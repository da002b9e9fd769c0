"""Strict input and the one error shape: what a client sends wrong is a 422 naming it, never a 500."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import get_args

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from svc_helpers import H200, KB, settings_for

from kernelsearch.db.store import Store
from kernelsearch.db.statuses import ACTIVE_STATUSES, FINISHED_STATUSES, JOB_STATUSES
from kernelsearch.service import schemas
from kernelsearch.service.api import create_app

JSON = {"Content-Type": "application/json"}


def _post(c: TestClient, path: str, text: str, **headers: str):
    return c.post(path, content=text.encode("utf-8", "surrogatepass"), headers={**JSON, **headers})


def _shaped(r) -> dict:
    """The one error shape: a `detail` sentence and a list of field errors, nothing else."""
    body = r.json()
    assert set(body) == {"detail", "errors"}, body
    assert isinstance(body["detail"], str) and body["detail"]
    assert all(set(e) == {"loc", "msg", "type"} for e in body["errors"]), body
    return body


# -- item 4: non-finite numbers and lone surrogates in JSON bodies -------------------------------
GOOD = f'"kernel": "{KB}", "cases": [{{"seq_len": 2}}], "n_trials": 1'


@pytest.mark.parametrize("text, loc", [
    (f'{{{GOOD}, "timeout_s": NaN}}', ["body", "timeout_s"]),
    (f'{{{GOOD}, "timeout_s": Infinity}}', ["body", "timeout_s"]),
    (f'{{{GOOD}, "timeout_s": -Infinity}}', ["body", "timeout_s"]),
    (f'{{{GOOD}, "timeout_s": 1e400}}', ["body", "timeout_s"]),
    (f'{{"kernel": "{KB}", "cases": "all", "n_trials": NaN}}', ["body", "n_trials"]),
    (f'{{"kernel": "{KB}", "cases": [{{"seq_len": -1e400}}], "n_trials": 1}}',
     ["body", "cases", 0, "seq_len"]),
    (f'{{{GOOD}, "extra": [1, {{"deep": Infinity}}]}}', ["body", "extra", 1, "deep"]),
    ('{"kernel": "\\ud800", "cases": "all", "n_trials": 1}', ["body", "kernel"]),
    (f'{{{GOOD}, "sampler": "tpe\\udfff"}}', ["body", "sampler"]),
    (f'{{{GOOD}, "\\ud800": 1}}', ["body"]),
    (f'{{"kernel": "{KB}", "cases": [{{"\\ud83d": 1}}], "n_trials": 1}}', ["body", "cases", 0]),
    (f'{{{GOOD}, "sampler": "tp\\u0000e"}}', ["body", "sampler"]),
])
def test_unencodable_json_bodies_are_422_naming_the_field(sqlite_client: TestClient, text: str,
                                                         loc: list) -> None:
    r = _post(sqlite_client, "/v1/jobs", text)
    assert r.status_code == 422, r.text
    body = _shaped(r)
    assert body["errors"][0]["loc"] == loc
    assert sqlite_client.get("/v1/jobs").json() == [], "nothing was queued"


def test_raw_surrogate_bytes_and_other_json_routes(sqlite_client: TestClient) -> None:
    # The surrogate as raw (invalid) UTF-8 bytes rather than an escape; Python's json reads both.
    r = sqlite_client.post("/v1/jobs", content=b'{"kernel": "\xed\xa0\x80", "cases": "all", "n_trials": 1}',
                           headers=JSON)
    assert r.status_code in (400, 422), r.text
    _shaped(r)
    # Any JSON body, on any route: the cancel route takes none, a NaN in one is still refused.
    r = _post(sqlite_client, "/v1/jobs/1/cancel", '{"why": NaN}')
    assert r.status_code == 422 and _shaped(r)["errors"][0]["loc"] == ["body", "why"]


# -- item 11: strict integers and text ------------------------------------------------------------
@pytest.mark.parametrize("body", [
    {"kernel": KB, "cases": "all", "n_trials": True},
    {"kernel": KB, "cases": "all", "n_trials": "3"},
    {"kernel": KB, "cases": "all", "n_trials": 3.0},
    {"kernel": KB, "cases": [{"seq_len": True}], "n_trials": 1},
    {"kernel": KB, "cases": [{"seq_len": "2"}], "n_trials": 1},
    {"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1, "timeout_s": True},
])
def test_post_refuses_non_integers_for_integer_fields(sqlite_client: TestClient, body: dict) -> None:
    r = sqlite_client.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    _shaped(r)


@pytest.mark.parametrize("value", ["1_000", "\u0661\u0662", "\uff11\uff12", " 12", "12 ", "+12",
                                   "12.0", "0x10"])
def test_best_refuses_lax_integer_text(sqlite_client: TestClient, value: str) -> None:
    r = sqlite_client.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": value})
    assert r.status_code == 422, r.text
    assert "seq_len" in _shaped(r)["detail"]


@pytest.mark.parametrize("path", ["/v1/jobs?limit=1_0", "/v1/jobs?limit=%D9%A1", "/v1/jobs/1_0",
                                  "/v1/jobs/%EF%BC%91"])
def test_integer_params_refuse_lax_text(sqlite_client: TestClient, path: str) -> None:
    r = sqlite_client.get(path)
    assert r.status_code == 422, r.text
    _shaped(r)


@pytest.mark.parametrize("path, params", [
    ("/v1/best", {"kernel": KB, "device": "H2\x0000", "seq_len": 8}),
    ("/v1/records", {"device": "H2\x0000"}),
    ("/", {"kernel": KB, "device": "H2\x0000", "seq_len": 8}),
    ("/", {"kernel": KB, "device": H200, "seq_len": "8\x00"}),
    ("/v1/jobs", {"status\x00": "queued"}),
])
def test_nul_in_any_query_parameter_is_422(client: TestClient, path: str, params: dict) -> None:
    # `client` runs on PostgreSQL too, which refused the NUL with a 500 before.
    r = client.get(path, params=params)
    assert r.status_code == 422, r.text[:300]
    assert "U+0000" in _shaped(r)["detail"]


# -- one error shape ------------------------------------------------------------------------------
def test_every_4xx_has_the_one_shape(store: Store) -> None:
    s = settings_for(store.url, api_token="tok", max_body_bytes=300)
    with TestClient(create_app(s, store=store)) as c:
        auth = {"Authorization": "Bearer tok"}
        answers = [
            (c.get("/v1/kernels/nope"), 404),
            (c.get("/no/such/route"), 404),
            (c.delete("/v1/jobs"), 405),
            (c.get("/v1/jobs", params={"limit": 0}), 422),
            (c.get("/v1/best", params={"kernel": KB, "device": H200}), 422),
            (c.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": 9}), 404),
            (c.post("/v1/jobs", json={"kernel": KB, "cases": "all", "n_trials": 1}), 401),
            (c.post("/v1/jobs", json={"kernel": KB, "cases": "x", "n_trials": 0}, headers=auth), 422),
            (c.post("/v1/jobs", content=b'{"kernel": ', headers={**JSON, **auth}), 422),
            (c.post("/v1/jobs", content=b"x" * 400, headers={**JSON, **auth}), 413),
            (c.get("/v1/jobs/99"), 404),
        ]
        for r, status in answers:
            assert r.status_code == status, (r.request.url, r.text)
            _shaped(r)
        # pydantic's errors are listed field by field, without echoing the input.
        r = c.post("/v1/jobs", json={"kernel": KB, "cases": "all", "n_trials": 0}, headers=auth)
        body = _shaped(r)
        assert body["errors"] == [{"loc": ["body", "n_trials"], "type": "greater_than",
                                   "msg": "Input should be greater than 0"}]
        assert "body.n_trials" in body["detail"]


def test_openapi_documents_the_error_shape(sqlite_client: TestClient) -> None:
    spec = sqlite_client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas, "FastAPI's own 422 shape is not what we answer"
    assert set(schemas["Message"]["properties"]) == {"detail", "errors"}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            content = op["responses"]["4XX"]["content"]
            html = "text/html" in op["responses"].get("200", {}).get("content", {})
            # An HTML page's own refusals are its 4xx page; those before it (a bad path) JSON.
            assert set(content) == ({"application/json", "text/html"} if html
                                    else {"application/json"}), (method, path)
            ref = content["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/Message", (method, path)


# -- item 12: the bearer token is compared whole ---------------------------------------------------
@pytest.mark.parametrize("given", ["s3cret-token-and-more", "s3cret-tokenX", "s3cret-toke", "s",
                                   "S3CRET-TOKEN"])
def test_token_must_match_exactly(sqlite_store: Store, given: str) -> None:
    s = settings_for(sqlite_store.url, api_token="s3cret-token")
    body = {"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1}
    with TestClient(create_app(s, store=sqlite_store)) as c:
        r = c.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {given}"})
        assert r.status_code == 401, r.text
        assert c.get("/v1/jobs").json() == []
        ok = c.post("/v1/jobs", json=body, headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 202


# -- item 7: the docs pages work without internet --------------------------------------------------
class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._in_script = tag == "script"
        for name, value in attrs:
            if name in ("src", "href", "spec-url") and value:
                self.urls.append(value)

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(sqlite_client: TestClient, page: str) -> None:
    r = sqlite_client.get(page)
    assert r.status_code == 200
    refs = _Refs()
    refs.feed(r.text)
    scripted = [u for s in refs.scripts for u in re.findall(r"url:\s*'([^']+)'", s)]
    urls = refs.urls + scripted
    assert any(u.endswith(".js") for u in urls), urls
    assert not re.search(r"(https?:)?//", r.text), "the page names another host"
    for u in urls:
        assert u.startswith("/"), u
        got = sqlite_client.get(u)
        assert got.status_code == 200 and got.content, u


# -- any JSON body, generated ----------------------------------------------------------------------
_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(st.characters(codec=None, exclude_categories=())))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=12)


@given(extra=_values, field=st.sampled_from(["kernel", "cases", "n_trials", "timeout_s", "sampler",
                                             "x"]))
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_json_body_gets_a_500(sqlite_client: TestClient, extra, field: str) -> None:
    body = {"kernel": KB, "cases": [{"seq_len": 2}], "n_trials": 1, field: extra}
    r = _post(sqlite_client, "/v1/jobs", json.dumps(body, allow_nan=True))
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        _shaped(r)


def test_the_api_job_statuses_are_the_stores() -> None:
    assert JOB_STATUSES == ACTIVE_STATUSES + FINISHED_STATUSES
    assert get_args(schemas.JobStatus) == JOB_STATUSES
