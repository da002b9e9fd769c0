"""Fixtures of the service tests: an app over a migrated store, and records to look up."""
from __future__ import annotations

from trusted_records import trusted

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from svc_helpers import H200, record, settings_for

from kernelsearch.db.store import Store
from kernelsearch.service.api import create_app
from kernelsearch.service.settings import Settings


@pytest.fixture
def add_record(store: Store) -> Callable[..., Any]:
    def add(kernel: str, axes: dict[str, int], latency_us: float, device: str = H200, **kw: Any):
        view, _ = store.upsert_best(trusted(record(kernel, axes, latency_us, device, **kw)))
        return view

    return add


@pytest.fixture
def settings(store: Store) -> Settings:
    return settings_for(store.url)


@pytest.fixture
def client(store: Store, settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, store=store)) as c:
        yield c


@pytest.fixture
def sqlite_client(sqlite_store: Store) -> Iterator[TestClient]:
    """A client on SQLite only: for input validation, which no database changes."""
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        yield c
