"""Fixtures of the @kernelsearch.autotune tests: the example plugin installed, a migrated store of
each kind with this process's lookup state reset."""
from __future__ import annotations

import importlib
import site
import subprocess
import sys
import sysconfig
from importlib import metadata
from typing import Iterator

import pytest

from at_env import EXAMPLE, KERNEL, REPO


def _installed() -> bool:
    eps = metadata.entry_points(group="kernelsearch.kernels")
    return any(ep.name == KERNEL for ep in eps)


@pytest.fixture(scope="session")
def example_installed() -> str:
    """The example package installed into this venv (editable), as a user would install it."""
    if not _installed():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(EXAMPLE),
                        "--no-deps"], check=True, timeout=600)
        # This process read its .pth files before the install: read them again, so that the
        # package imports here too (fresh processes see it by themselves).
        site.addsitedir(sysconfig.get_paths()["purelib"])
        importlib.invalidate_caches()
    importlib.import_module("ks_matmul_example")  # declares (and registers) it in this process
    return KERNEL


@pytest.fixture(autouse=True)
def _first_policy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the opt-in policy (KS_AUTOTUNE_FALLBACK=first: run the first config,
    let the workers tune); tests of the default (tune here) are marked `tune_default`."""
    if request.node.get_closest_marker("tune_default") is None:
        monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")


@pytest.fixture
def isolated_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                    tmp_path) -> None:
    """A user program's settings with no service, no local database and no lookup state left
    over: each test names the service or store it uses."""
    from kernelsearch.backends import BACKENDS

    names = ["KS_SERVICE_URL", "KS_AUTOTUNE_SYNC"]
    if request.node.get_closest_marker("tune_default") is not None:
        names.append("KS_AUTOTUNE_FALLBACK")
    for k in names:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    BACKENDS.reset()


@pytest.fixture
def at_store(store) -> Iterator[object]:
    """A migrated store of each kind (PostgreSQL when KS_TEST_POSTGRES_URL is set), with this
    process's lookup state forgotten around the test."""
    from kernelsearch.backends import BACKENDS

    BACKENDS.reset()
    yield store
    BACKENDS.reset()


# The service tests' helpers (a live uvicorn server, test settings): one definition of each.
sys.path.insert(0, str(REPO / "tests" / "service"))
