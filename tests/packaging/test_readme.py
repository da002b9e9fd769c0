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


def _commands(first_line: str) -> list[str]:
    return [ln for ln in _block(first_line).splitlines() if ln.strip()]


def _exported(lines: list[str], env: dict[str, str], subst: dict[str, str]) -> list[str]:
    """Apply a block's `export A=B C=D` lines to `env` (with `subst` applied); its other lines."""
    rest = []
    for line in lines:
        for old, new in subst.items():
            line = line.replace(old, new)
        if line.startswith("export "):
            for pair in line.removeprefix("export ").split():
                k, _, v = pair.partition("=")
                env[k] = v
        else:
            rest.append(line)
    return rest


def _cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KS_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["TRITON_INTERPRET"] = "1"
    return env


def test_the_readme_service_start_serves_the_best_example(tmp_path):
    """`db upgrade`, the records import, then the `/v1/best` example answers a record."""
    from fastapi.testclient import TestClient

    from kernelsearch.db.store import Store
    from kernelsearch.service.api import create_app
    from kernelsearch.service.settings import Settings

    url = f"sqlite:///{tmp_path / 'ks.db'}"
    env = {**_cli_env(tmp_path), "KS_DATABASE_URL": url}
    steps = _commands("kernelsearch db upgrade")
    assert steps[-1].startswith("kernelsearch serve")
    for step in steps[:-1]:
        res = subprocess.run(step, shell=True, env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, (step, res.stderr)
    (query,) = re.findall(r"curl '[^/]+(/v1/best\?[^']+)'", README)
    with Store(url) as store, TestClient(create_app(Settings(database_url=url, api_token=None),
                                                    store=store)) as c:
        got = c.get(query.replace("%20", " "))
    assert got.status_code == 200, got.text


def test_your_own_kernel_across_hosts_runs_as_written(tmp_path):
    """The section's commands, with its paths and host made this machine's: the service serves,
    the program tunes its key and shares it, `records list` through the service shows it."""
    import time

    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
    from svc_helpers import free_port

    port = free_port()
    code, user = tmp_path / "code", tmp_path / "user"
    code.mkdir()
    user.mkdir()
    kernel = _block("import torch")
    assert "@kernelsearch.autotune" in kernel
    for where in (code, user):
        (where / "my_kernels.py").write_text(kernel)
    subst = {"/srv/kernelsearch": str(tmp_path), "/srv/code": str(code),
             "service-host:8000": f"127.0.0.1:{port}", "--port 8000": f"--port {port}",
             "--host 0.0.0.0": "--host 127.0.0.1"}
    service_env = _cli_env(tmp_path)
    service = _exported(_commands("export KS_DATABASE_URL=sqlite:////srv/kernelsearch/ks.db "
                                  "KS_API_TOKEN=change-me"), service_env, subst)
    assert {"KS_JOB_MODULES", "PYTHONPATH", "KS_API_TOKEN"} <= set(service_env)
    upgrade, serve = service
    assert subprocess.run(upgrade, shell=True, env=service_env, cwd=tmp_path,
                          timeout=300).returncode == 0
    server = subprocess.Popen(serve, shell=True, env=service_env, cwd=tmp_path,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "serve did not start"
            time.sleep(0.5)
        user_env = _cli_env(tmp_path)
        call, listed = _exported(_commands("export KS_SERVICE_URL=http://service-host:8000 "
                                           "KS_API_TOKEN=change-me"), user_env, subst)
        res = subprocess.run(call, shell=True, env=user_env, cwd=user, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0 and "tensor([2., 2., 2.])" in res.stdout, res.stderr
        res = subprocess.run(listed, shell=True, env=user_env, cwd=user, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        (row,) = res.stdout.splitlines()[1:]
        assert row.startswith("my_kernels.double_kernel\t") and "n=1000" in row
    finally:
        import signal

        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


def test_the_readme_settings_table_is_the_fields_one():
    """README's table is generated from the settings' fields: regenerate it with
    `python -m kernelsearch.service.settings_doc` when a field changes."""
    from kernelsearch.service.settings import Settings
    from kernelsearch.service.settings_doc import BEGIN, END, settings_table

    start, end = README.index(BEGIN), README.index(END) + len(END)
    assert README[start:end] == settings_table()
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description"
