"""`make test` runs the PostgreSQL suites when a local PostgreSQL answers, as .ci/run does, and
leaves a KS_TEST_POSTGRES_URL already set alone."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _make_test(tmp_path: Path, pg_answers: bool, env_url: str | None) -> str:
    """`make test` with stand-ins for the venv's tools (each prints the URL pytest would get)
    and for pg_isready; what the stand-in pytest printed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    for tool in ("python", "ruff", "mypy"):
        script = venv / "bin" / tool
        script.write_text('#!/bin/sh\necho "url=${KS_TEST_POSTGRES_URL:-unset}"\n')
        script.chmod(0o755)
    fake = tmp_path / "path"
    fake.mkdir(exist_ok=True)
    pg = fake / "pg_isready"
    pg.write_text(f"#!/bin/sh\nexit {0 if pg_answers else 2}\n")
    pg.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "KS_TEST_POSTGRES_URL"}
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    if env_url is not None:
        env["KS_TEST_POSTGRES_URL"] = env_url
    out = subprocess.run(["make", "-s", "test", f"VENV={venv}"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make (apt-get install make)")
def test_make_test_runs_the_postgresql_suites_when_postgresql_answers(tmp_path) -> None:
    assert _make_test(tmp_path, True, None) == \
        "url=postgresql+psycopg://postgres@127.0.0.1:5432/test"
    assert _make_test(tmp_path, False, None) == "url=unset"
    assert _make_test(tmp_path, True, "postgresql+psycopg://me@db/x") == \
        "url=postgresql+psycopg://me@db/x"
