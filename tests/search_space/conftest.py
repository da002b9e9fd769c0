"""Fixtures of the search-space tests: a migrated SQLite store, the test kernel, a runner."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # the runner's spawned children import ks_fake_kernels too

import ks_fake_kernels  # noqa: E402,F401  (registers the test kernel in this process)
from ss_helpers import TEST_COMPILE_WORKERS  # noqa: E402

from kernelsearch.search_space.runner import TrialRunner  # noqa: E402


@pytest.fixture
def ss_store(migrated_sqlite_url: str) -> Iterator[tuple[object, str]]:
    """(Store, url) on a migrated SQLite file; Optuna's tables go into the same file."""
    from kernelsearch.db.store import Store

    sqlite_url = migrated_sqlite_url
    s = Store(sqlite_url)
    try:
        yield s, sqlite_url
    finally:
        s.close()


@pytest.fixture(scope="module")
def runner() -> Iterator[TrialRunner]:
    r = TrialRunner(trial_timeout_s=20.0, kernel_modules=["ks_fake_kernels"],
                    compile_workers=TEST_COMPILE_WORKERS)
    try:
        yield r
    finally:
        r.close()
