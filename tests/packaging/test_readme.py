"""README's examples run as written: the names it gives resolve, and its kernel call runs."""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_kernelsearch_name_in_the_readme_resolves():
    names = set(re.findall(r"\bkernelsearch(?:\.[A-Za-z_]\w*)+", README))
    assert "kernelsearch.rest_client" in names
    for name in sorted(names):
        _resolve(name)
    # A module path without the package prefix (`service.sources.StoreSource`) is not importable.
    assert not re.findall(r"`(?:service|search_space|kernels|db)\.\w+\.\w+", README)


def _block(first_line: str) -> str:
    """The indented code block of README that starts with `first_line`."""
    lines = README.splitlines()
    start = lines.index("    " + first_line)
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block))


def test_the_readme_kernel_call_runs_as_written(tmp_path):
    block = _block("import kernelsearch")
    assert "install_default_provider()" in block and "rope3d(gq, gk, q, k, emb)" in block
    env = {**os.environ, "KS_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"}
    env.pop("KS_SERVICE_URL", None)
    res = subprocess.run([sys.executable, "-c", block + "\nprint(grad_q.shape)"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "torch.Size" in res.stdout


def test_the_readme_client_example_names_real_methods():
    block = _block("from kernelsearch.rest_client import Client")
    from kernelsearch.rest_client import Client

    for method in re.findall(r"client\.(\w+)\(", block):
        assert callable(getattr(Client, method)), method
