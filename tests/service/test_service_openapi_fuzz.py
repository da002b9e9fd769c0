"""Schemathesis against the OpenAPI document, with every check (status codes, content types,
response schemas and headers, Allow on 405, negative data refused), valid and invalid inputs.

Positive-data acceptance is left out on the operations whose input depends on the kernel they
name (the axes of /v1/best and /case, the case axes and config of a job or an uploaded record),
on an undeclared kernel's definition (its key and dtype arguments must be among its
arguments), on a Helion cache entry (its `data` is Helion's JSON text inside a string) and a
Helion job (its capture is checked field by field, search_space/helion_job.py) and a compiled
kernel's files (their bytes are read: an ELF must be a CUDA cubin, no pickle stream, the group's
metadata file present, kernels.compiled.refusal): OpenAPI cannot say that `seq_len` belongs to one kernel and `total_patches` to
another, so a "schema-valid" request may still be a 422 there; every other check runs on them."""
from __future__ import annotations

from trusted_records import trusted

import tempfile

import pytest
from hypothesis import HealthCheck, settings
from svc_helpers import KB, record, settings_for

schemathesis = pytest.importorskip("schemathesis")

from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import positive_data_acceptance  # noqa: E402

from kernelsearch.db.engine import upgrade  # noqa: E402
from kernelsearch.db.store import Store  # noqa: E402
from kernelsearch.service.api import create_app  # noqa: E402

# Schemathesis reads the schema at collection, so the app (and its database) exist from then;
# the folder is removed when the test process exits.
_TMP = tempfile.TemporaryDirectory(prefix="ks-fuzz-")
_URL = f"sqlite:///{_TMP.name}/fuzz.db"
KERNEL_DEPENDENT = {("GET", "/v1/best"), ("GET", "/case"), ("POST", "/v1/jobs"),
                    ("POST", "/v1/records"), ("POST", "/v1/kernels"),
                    ("PUT", "/v1/helion/entries/{key}"), ("POST", "/v1/helion/jobs"),
                    ("POST", "/v1/artifacts"), ("POST", "/v1/helion/entries/{key}/artifacts")}


def _app():
    upgrade(_URL)
    store = Store(_URL)
    store.upsert_best(trusted(record(KB, {"seq_len": 128}, 20.0)))
    store.create_job(KB, [{"seq_len": 2}], 2, "tpe")
    return create_app(settings_for(_URL, api_token="fuzz-token", read_token="fuzz-token",
                                   max_queued_jobs=10_000),
                      store=store)


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_check_passes(case) -> None:
    op = (case.method.upper(), case.operation.path)
    excluded = [positive_data_acceptance] if op in KERNEL_DEPENDENT else []
    for headers in (None, {"Authorization": "Bearer fuzz-token"}):
        case.call_and_validate(headers=headers, excluded_checks=excluded)


HELION_OPERATIONS = {("PUT", "/v1/helion/entries/{key}"), ("GET", "/v1/helion/entries/{key}"),
                     ("GET", "/v1/helion/entries"), ("POST", "/v1/helion/jobs")}


def test_the_helion_routes_run_in_the_coverage_phase() -> None:
    """Schemathesis' coverage phase (boundary and invalid values of every parameter and body
    field) runs on the Helion routes with the others: they are in the schema and nothing turns
    the phase off for them. Their hostile entry text is tests/service/test_helion.py's."""
    ops = {(op.method.upper(), op.path): op for op in (r.ok() for r in schema.get_all_operations())}
    assert HELION_OPERATIONS <= set(ops)
    for key in HELION_OPERATIONS:
        assert schema.config.phases_for(operation=ops[key]).coverage.enabled, key


@pytest.mark.parametrize("path, methods", [("/v1/jobs", "GET, POST"), ("/v1/records", "GET, POST"),
                                           ("/v1/jobs/1/cancel", "POST")])
def test_405_names_every_method_of_the_path(sqlite_client, path: str, methods: str) -> None:
    for method in ("OPTIONS", "DELETE", "PUT"):
        r = sqlite_client.request(method, path)
        assert r.status_code == 405, (method, r.text)
        assert r.headers["Allow"] == methods
        assert r.json()["detail"]


def test_html_pages_document_their_4xx_pages(sqlite_client) -> None:
    doc = sqlite_client.get("/openapi.json").json()
    for path in ("/case", "/jobs/{job_id}"):
        four = doc["paths"][path]["get"]["responses"]["4XX"]["content"]
        assert set(four) == {"text/html", "application/json"}, path
    r = sqlite_client.get("/jobs/999")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    limit = next(p for p in doc["paths"]["/v1/jobs"]["get"]["parameters"] if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 1000)
