"""Paths and subprocess environments of the autotune tests (a unique module name: every test
folder's conftest is called `conftest`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "matmul"
HERE = Path(__file__).resolve().parent
KERNEL = "triton_tutorial_matmul"


def child_env(**extra: str) -> dict[str, str]:
    """A fresh process's environment: the interpreter on, this folder importable, no KS_* left
    over from the test process except what the test gives."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KS_")}
    env["TRITON_INTERPRET"] = "1"
    env["KS_AUTOTUNE_FALLBACK"] = "first"  # the opt-in policy these tests are about
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


# Configs timed by `counting_bench` in this process: a user program tells whether it benchmarked.
BENCHED: list[str] = []


def counting_bench(fn, quantiles=None, **_kw):
    """triton.testing.do_bench's answer shape, by the wall clock; counts every config it times."""
    BENCHED.append("x")
    fn()
    t0 = time.perf_counter()
    fn()
    dt = (time.perf_counter() - t0) * 1e3
    return [dt, dt, dt]


def run_user(script: str, *args: object, env: dict[str, str]) -> dict:
    """A user program of this folder in a fresh process: its last output line, as JSON."""
    out = subprocess.run([sys.executable, str(HERE / script), *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=HERE)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])
