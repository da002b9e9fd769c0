"""Shared fixtures: a private SQLite file or a private PostgreSQL database per test.

PostgreSQL tests run only when KS_TEST_POSTGRES_URL names a server (CI:
postgresql+psycopg://postgres@127.0.0.1:5432/test); each gets its own `ks_test_<hex>` database,
dropped afterwards, so helpers sharing the server never see each other's rows.
"""
from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

# First, before any folder's helpers import triton.language: without a GPU this sets
# TRITON_INTERPRET=1, which triton.language reads once (imported earlier, the interpreter's kernels
# fail with "Cannot call @triton.jit'd outside of the scope of a kernel" when folders mix).
import kernelsearch.kernels  # noqa: F401

PG_ENV = "KS_TEST_POSTGRES_URL"
PG_SKIP_REASON = f"{PG_ENV} is not set: PostgreSQL side skipped"


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get(PG_ENV):
        url = make_url(os.environ[PG_ENV]).render_as_string(hide_password=True)
        return f"postgres tests: on ({url})"
    return f"postgres tests: off ({PG_SKIP_REASON})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(PG_ENV):
        return
    skip = pytest.mark.skip(reason=PG_SKIP_REASON)
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """Say plainly, after pytest's own summary, that the PostgreSQL side did not run, so a green
    SQLite run is not mistaken for a full one."""
    yield
    if os.environ.get(PG_ENV):
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "postgres" in getattr(r, "keywords", {})]
    if skipped:
        terminalreporter.write_sep("=", "PostgreSQL side skipped", yellow=True)
        terminalreporter.write_line(
            f"{len(skipped)} tests marked postgres were skipped because {PG_ENV} is not set; "
            f"set it (e.g. {PG_ENV}=postgresql+psycopg://postgres@127.0.0.1:5432/test) to run them."
        )


@pytest.fixture(autouse=True)
def _settings_read_per_test() -> Iterator[None]:
    """The server's settings are cached per process (`get_settings`): each test reads them under
    its own environment, so a CLI command run by one test never uses another test's database."""
    from kernelsearch.service.settings import get_settings

    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def make_db_url(tmp_path) -> Iterator[Callable[[str], str]]:
    """A factory of further empty databases: make_db_url("sqlite") or make_db_url("postgres")
    (the latter skips when KS_TEST_POSTGRES_URL is unset); all are dropped after the test."""
    base = os.environ.get(PG_ENV)
    admin = create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool) if base else None
    created: list[str] = []

    def make(kind: str) -> str:
        if kind == "sqlite":
            return f"sqlite:///{tmp_path / f'ks_{uuid.uuid4().hex[:8]}.db'}"
        if kind != "postgres":
            raise ValueError(f"kind: expected 'sqlite' or 'postgres', got {kind!r}")
        if admin is None:
            pytest.skip(PG_SKIP_REASON)
        name = f"ks_test_{uuid.uuid4().hex[:16]}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        created.append(name)
        return make_url(base).set(database=name).render_as_string(hide_password=False)

    try:
        yield make
    finally:
        if admin is not None:
            with admin.connect() as conn:
                for name in created:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A fresh SQLite file in the test's temporary folder (not yet migrated)."""
    return f"sqlite:///{tmp_path / 'ks.db'}"


@pytest.fixture
def pg_url(make_db_url: Callable[[str], str]) -> str:
    """A private, empty PostgreSQL database (`ks_test_<hex>`) on the server in
    KS_TEST_POSTGRES_URL, dropped after the test; skips when the variable is unset."""
    return make_db_url("postgres")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """An empty database of each kind (the PostgreSQL one only when the server is configured)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(scope="session")
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file migrated to head per session (per xdist worker): the store fixtures copy
    it instead of running every migration again per test (test_migrations proves upgrade)."""
    from kernelsearch.db.engine import upgrade

    path = tmp_path_factory.mktemp("template") / "ks_head.db"
    upgrade(f"sqlite:///{path}")
    return path


def _copy_template(url: str, template: Path) -> str:
    """`url` (a not yet existing SQLite file) as a copy of the migrated template."""
    target = Path(make_url(url).database or "")
    assert url.startswith("sqlite:///") and not target.exists(), url
    shutil.copyfile(template, target)
    return url


@pytest.fixture
def migrated_sqlite_url(sqlite_url: str, migrated_sqlite_template: Path) -> str:
    """sqlite_url, already migrated to head (a copy of the session's template)."""
    return _copy_template(sqlite_url, migrated_sqlite_template)


def _migrated_store(url: str, template: Path) -> Iterator[object]:
    """The body of the store fixtures: a database at head (SQLite: a copy of the template;
    PostgreSQL: upgraded), a Store on it, closed afterwards."""
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store

    if url.startswith("sqlite:///"):
        _copy_template(url, template)
    else:
        upgrade(url)
    with Store(url) as s:
        yield s


@pytest.fixture
def store(db_url: str, migrated_sqlite_template: Path) -> Iterator[object]:
    """A `db.store.Store` on an upgraded database of each kind."""
    yield from _migrated_store(db_url, migrated_sqlite_template)


@pytest.fixture
def sqlite_store(sqlite_url: str, migrated_sqlite_template: Path) -> Iterator[object]:
    """A migrated SQLite store, for tests that need no PostgreSQL twin."""
    yield from _migrated_store(sqlite_url, migrated_sqlite_template)
