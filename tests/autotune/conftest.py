"""Fixtures of the @kernelsearch.autotune tests: the example plugin installed, a migrated SQLite
store, subprocess environments that see (or do not see) a service."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "matmul"
HERE = Path(__file__).resolve().parent
KERNEL = "triton_tutorial_matmul"


def _installed() -> bool:
    eps = metadata.entry_points(group="kernelsearch.kernels")
    return any(ep.name == KERNEL for ep in eps)


@pytest.fixture(scope="session")
def example_installed() -> str:
    """The example package installed into this venv (editable), as a user would install it."""
    if not _installed():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(EXAMPLE),
                        "--no-deps"], check=True, timeout=600)
    return KERNEL


@pytest.fixture
def at_store(store) -> Iterator[object]:
    """A migrated store of each kind (PostgreSQL when KS_TEST_POSTGRES_URL is set), with this
    process's lookup state forgotten around the test."""
    from kernelsearch.service.autotune import BACKENDS

    BACKENDS.reset()
    yield store
    BACKENDS.reset()


def child_env(**extra: str) -> dict[str, str]:
    """A fresh process's environment: the interpreter on, this folder importable, no KS_* left
    over from the test process except what the test gives."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KS_")}
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


# The service tests' helpers (a live uvicorn server, test settings): one definition of each.
sys.path.insert(0, str(REPO / "tests" / "service"))
