"""The kernel a user brings (`@kernelsearch.autotune` with no declaration) in every surface of the
service: one source identity, names of any length and script, every route and page answering
it (a 4xx saying why where it cannot serve), jobs from its stored capture."""
from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from svc_helpers import settings_for
from user_kernels import DEVICE, LONG, SHORT, SOURCE, axes, definition, forget, und_record

from kernelsearch.db.store import Store
from kernelsearch.db.views import WORKER_VERSIONS
from kernelsearch.kernels.device import versions
from kernelsearch.service.api import create_app


@pytest.fixture
def user_client(store: Store) -> Iterator[TestClient]:
    """A service on a store of each kind with two undeclared kernels registered as their
    decorators register them: one of a short non-ASCII name, one of a long one."""
    app = create_app(settings_for(store.url), store=store)
    try:
        with TestClient(app) as c:
            for name in (SHORT, LONG):
                got = c.post("/v1/kernels", json=definition(name))
                assert got.status_code == 201, got.text
            yield c
    finally:
        forget(SHORT, LONG)


def _best(c: TestClient, name: str, n: int) -> dict:
    got = c.get("/v1/best", params={"kernel": name, "device": DEVICE, **axes(n)})
    assert got.status_code == 200, got.text
    return got.json()


@pytest.mark.parametrize("name", [SHORT, LONG], ids=["non-ascii", "long"])
def test_a_record_of_this_code_is_the_same_version_everywhere(user_client: TestClient, store: Store,
                                                              name: str) -> None:
    """The record the decorator (or a worker, from the same definition) stores carries the
    definition's source identity: /v1/best says same_versions and the dashboard shows no drift;
    a record of other code says so in both."""
    store.ensure_device({"name": DEVICE, WORKER_VERSIONS: versions()})
    store.upsert_best(und_record(name, 1024, 10.0))
    store.upsert_best(und_record(name, 4096, 30.0, source_hash="0the4c0de0000000"))
    same, other = _best(user_client, name, 1024), _best(user_client, name, 4096)
    assert same["match"] == "exact" and same["same_versions"] is True
    assert same["current_versions"]["source_hash"] == SOURCE == same["versions"]["source_hash"]
    assert other["match"] == "exact" and other["same_versions"] is False
    page = user_client.get("/", params={"kernel": name})
    assert page.status_code == 200, page.text
    assert "1 of 2 records were tuned under other" in page.text
    assert "kernel source 0the4c0de0000000" in page.text
    assert f"kernel source {SOURCE}" not in page.text
