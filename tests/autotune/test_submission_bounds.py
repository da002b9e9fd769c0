"""What one request may queue or replace: POST /v1/search takes a bounded share of the queue
(KS_SEARCH_QUEUE_SHARE of its room) and queues nothing for a module the workers do not import
(KS_JOB_MODULES); POST /v1/kernels never replaces the module of a kernel with stored calls."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import triton
from fastapi.testclient import TestClient
from svc_helpers import KB, settings_for
from test_search_jobs import NAME, _definition

from kernelsearch.db.store import Store
from kernelsearch.kernels.capture import Capture, capture_call
from kernelsearch.service.api import create_app
from kernelsearch.service.definitions import register_definition

pytestmark = pytest.mark.usefixtures("isolated_client")
KEYS = 8


def _keep_calls(store: Store) -> None:
    """KEYS stored calls of the undeclared kernel, each its own key (n)."""
    store.save_definition(NAME, _definition())
    register_definition(_definition(), store)
    configs = _definition()["configs"]
    for i in range(KEYS):
        n = 200 + i
        cap = capture_call({"x_ptr": torch.randn(n), "y_ptr": torch.empty(n), "n": n}, ["BLOCK"],
                           configs, lambda meta, n=n: (triton.cdiv(n, meta["BLOCK"]),)).as_json()
        axes = {"n": n, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
        assert store.save_capture(NAME, axes, cap, Capture.from_json(cap).digest)


@pytest.fixture
def client(sqlite_store: Store) -> Iterator[Any]:
    def make(**kw: Any) -> TestClient:
        return TestClient(create_app(settings_for(sqlite_store.url, max_queued_jobs=10, **kw),
                                     store=sqlite_store))

    _keep_calls(sqlite_store)
    yield make


def test_one_search_request_takes_half_the_queues_room_and_says_what_it_left_out(
        sqlite_store: Store, client: Any) -> None:
    sqlite_store.create_job(KB, [{"seq_len": 2}], 2, "tpe")
    sqlite_store.create_job(KB, [{"seq_len": 4}], 2, "tpe")
    with client(job_modules=["ks_undeclared_user"]) as c:
        got = c.post("/v1/search", json={"kernel": NAME})
        assert got.status_code == 202, got.text
        assert len(got.json()["jobs"]) == 4 and got.json()["left_out"] == KEYS - 4
        # A user's ordinary job still has room.
        r = c.post("/v1/jobs", json={"kernel": KB, "cases": [{"seq_len": 8}], "n_trials": 2})
        assert r.status_code in (200, 201, 202), r.text
        again = c.post("/v1/search", json={}).json()  # half of the 3 left: one new job
        assert sum(not j["existing"] for j in again["jobs"]) == 1


def test_a_search_for_a_module_no_worker_imports_is_refused_naming_it(
        sqlite_store: Store, client: Any) -> None:
    with client() as c:
        got = c.post("/v1/search", json={"kernel": NAME})
        assert got.status_code == 422 and "'ks_undeclared_user'" in got.text
        got = c.post("/v1/search", json={})
        assert got.status_code == 422 and "KS_JOB_MODULES" in got.text
    assert sqlite_store.count_jobs(status="queued") == 0


def test_a_captured_kernels_module_is_never_replaced_by_another_definition(
        sqlite_store: Store, client: Any) -> None:
    """A stored call makes workers import the definition's module: POST /v1/kernels naming
    another module for the kernel is refused (it once replaced it, records or not)."""
    other = {**_definition(), "module": "attacker.kernels"}
    with client(job_modules=["ks_undeclared_user", "attacker"]) as c:
        got = c.post("/v1/kernels", json=other)
        assert got.status_code == 409 and "captured calls" in got.text, got.text
        assert c.post("/v1/kernels", json=_definition()).status_code == 201
    assert sqlite_store.kernel_definitions()[NAME]["module"] == "ks_undeclared_user"
