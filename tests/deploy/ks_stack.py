"""Read docker-compose.yml the way Compose does and run its services as local processes.

No Docker engine runs here, so the deployment tests take each service's `command:` and
`environment:` from the compose file, resolve `${VAR...}` references like Compose, and start
exactly those commands with this environment's `kernelsearch` console script.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"

# $$ | ${NAME} | ${NAME:-x} ${NAME-x} ${NAME:?x} ${NAME?x} ${NAME:+x} ${NAME+x} | $NAME
_VAR = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                  r"(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


class MissingVariable(KeyError):
    """A `${NAME:?message}` reference whose variable is unset: Compose refuses to start."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(name)
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Resolve Compose variable references in every string of `value` (dicts, lists, scalars)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group("dollar"):
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        have = name in env
        nonempty = have and env[name] != ""
        if op in (":-", "-"):
            use = nonempty if op == ":-" else have
            return env[name] if use else arg
        if op in (":?", "?"):
            ok = nonempty if op == ":?" else have
            if not ok:
                raise MissingVariable(name, arg or "required variable is not set")
            return env[name]
        if op in (":+", "+"):
            use = nonempty if op == ":+" else have
            return arg if use else ""
        return env.get(name, "")

    return _VAR.sub(sub, value)


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file as YAML data (anchors and merge keys resolved, variables not)."""
    return yaml.safe_load(path.read_text())


def service_spec(name: str, env: dict[str, str], path: Path = COMPOSE_FILE) -> tuple[list[str], dict[str, str]]:
    """(command argv, environment) of one service, variables resolved against `env`."""
    svc = load_compose(path)["services"][name]
    command = interpolate(svc["command"], env)
    if isinstance(command, str):
        command = command.split()
    environment = interpolate(svc.get("environment") or {}, env)
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return [str(c) for c in command], {k: str(v) for k, v in environment.items()}


def kernelsearch_exe() -> str:
    """This interpreter's `kernelsearch` console script (the image puts it on PATH)."""
    exe = Path(sys.executable).parent / "kernelsearch"
    if not exe.exists():
        raise RuntimeError(f"{exe} missing: install the project (pip install -e .)")
    return str(exe)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    """A started service process and its log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Stack:
    """Processes started from compose services; `close()` stops them all (SIGTERM, then SIGKILL)."""

    workdir: Path
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)

    def run_once(self, service: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run a one-shot service (e.g. migrate) to completion."""
        argv, env = self._spec(service)
        return subprocess.run(argv, env=env, cwd=self.workdir, capture_output=True, text=True,
                              timeout=timeout)

    def start(self, service: str, name: str | None = None, extra_env: dict[str, str] | None = None) -> Proc:
        argv, env = self._spec(service)
        env.update(extra_env or {})
        name = name or service
        log = self.workdir / f"{name}.log"
        with log.open("wb") as fh:
            popen = subprocess.Popen(argv, env=env, cwd=self.workdir, stdout=fh,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def _spec(self, service: str) -> tuple[list[str], dict[str, str]]:
        argv, service_env = service_spec(service, self.env)
        if argv[0] == "kernelsearch":
            argv[0] = kernelsearch_exe()
        # The container's environment is the service's own plus a minimal base (PATH, HOME):
        # only what the compose file hands over reaches the process.
        base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
        base.update({k: v for k, v in self.env.items() if k.startswith(("TRITON_", "PYTHON"))})
        return argv, {**base, **service_env}

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (rc={p.popen.poll()}) ---\n{p.tail()}" for p in self.procs)

    def stop(self, proc: Proc, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if proc.alive():
            proc.popen.send_signal(sig)
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)
        return proc.popen.returncode

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(10)


def wait_healthy(base: str, proc: Proc, timeout: float = 120) -> dict[str, Any]:
    """Poll /healthz until it answers 200; fail with the process's log when it dies or never does."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        try:
            r = httpx.get(base + "/healthz", timeout=3)
            if r.status_code == 200:
                return r.json()
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.25)
    raise AssertionError(f"{proc.name} not healthy in {timeout} s (last: {last}):\n{proc.tail()}")


def wait_job(client: httpx.Client, job_id: int, stack: Stack, *, until: tuple[str, ...] = ("succeeded",),
             timeout: float = 300, final: tuple[str, ...] = ("succeeded", "failed", "cancelled")) -> dict[str, Any]:
    """Poll GET /v1/jobs/{id} until its status is in `until`; fail early on another final status."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job = r.json()
        if job["status"] in until:
            return job
        if job["status"] in final:
            raise AssertionError(f"job ended {job['status']}: {job.get('error')}\n{stack.logs()}")
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not {until} in {timeout} s: {job}\n{stack.logs()}")
