"""Schemathesis against the OpenAPI document: no generated request may get a 5xx."""
from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, settings
from svc_helpers import KB, record, settings_for

schemathesis = pytest.importorskip("schemathesis")

from kernelsearch.db.engine import upgrade  # noqa: E402
from kernelsearch.db.store import Store  # noqa: E402
from kernelsearch.service.api import create_app  # noqa: E402

# Schemathesis reads the schema at collection, so the app (and its database) exist from then;
# the folder is removed when the test process exits.
_TMP = tempfile.TemporaryDirectory(prefix="ks-fuzz-")
_URL = f"sqlite:///{_TMP.name}/fuzz.db"


def _app():
    upgrade(_URL)
    store = Store(_URL)
    store.upsert_best(record(KB, {"seq_len": 128}, 20.0))
    store.create_job(KB, [{"seq_len": 2}], 2, "tpe")
    return create_app(settings_for(_URL, api_token="fuzz-token", max_queued_jobs=10_000),
                      store=store)


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case) -> None:
    for headers in (None, {"Authorization": "Bearer fuzz-token"}):
        response = case.call(headers=headers)
        assert response.status_code < 500, (case.method, case.path, response.status_code,
                                            response.text[:500])
