"""Paths and subprocess environments of the autotune tests (a unique module name: every test
folder's conftest is called `conftest`)."""
from __future__ import annotations

import os
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
