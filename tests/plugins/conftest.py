"""The plugin tests: a user's kernel module on the path, as KS_KERNEL_MODULES would find it."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # the runner's spawned children import ks_user_axpy too


import pytest  # noqa: E402


@pytest.fixture
def ss_store(sqlite_url: str):
    """(Store, url) on a migrated SQLite file; Optuna's tables go into the same file."""
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store

    upgrade(sqlite_url)
    s = Store(sqlite_url)
    try:
        yield s, sqlite_url
    finally:
        s.close()
