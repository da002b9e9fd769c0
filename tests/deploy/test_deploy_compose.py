"""The compose files, service/Dockerfile and the GPU override generator (service.deploy), checked
without a Docker engine."""
from __future__ import annotations

import fnmatch
import importlib
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ks_stack import COMPOSE_FILE, ROOT, MissingVariable, interpolate, load_compose, service_spec

SECRETS = {
    "POSTGRES_PASSWORD": "pw-from-test",
    "KS_DATABASE_URL": "postgresql+psycopg://kernelsearch:pw-from-test@postgres:5432/kernelsearch",
    "KS_API_TOKEN": "token-from-test",
}
APP_SERVICES = ("migrate", "seed", "api", "worker")
DEPLOY = ROOT / "service" / "deploy"
WORKER_HOST_FILE = DEPLOY / "worker-host.yml"
DOCKERFILE = ROOT / "service" / "Dockerfile"
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="Debian's docker-compose is not installed (apt-get install docker-compose): "
           "`config` validation skipped; the structural checks still ran")


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


def _gpu_workers():
    return importlib.import_module("kernelsearch.service.deploy.gpu_workers")


def _module_cli(module: str, *args: str, **kw) -> subprocess.CompletedProcess:
    """`python -m <module> args...` from the repository root, as the docs run it."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, **kw)


def _devices(svc: dict) -> list[dict]:
    return svc["deploy"]["resources"]["reservations"]["devices"]


# ----------------------------------------------------------------------------- structure
def test_services_present(compose):
    assert {"postgres", "migrate", "api", "worker"} <= set(compose["services"])


def test_postgres_official_image_volume_healthcheck(compose):
    pg = compose["services"]["postgres"]
    assert re.fullmatch(r"postgres:\d+(\.\d+)?(-[a-z0-9]+)?", pg["image"]), pg["image"]
    volume, target = pg["volumes"][0].split(":")[:2]
    assert target == "/var/lib/postgresql/data"
    assert volume in compose["volumes"], "the data volume must be a named volume"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert pg["restart"] in ("always", "unless-stopped")


def test_start_order_waits_on_health(compose):
    s = compose["services"]
    assert s["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert s["migrate"]["restart"] == "no"
    for name in ("api", "worker"):
        deps = s[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["postgres"]["condition"] == "service_healthy", name
    assert s["seed"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_commands(compose):
    env = {**SECRETS, "KS_API_HOST": "127.0.0.1", "KS_API_PORT": "8123"}
    assert service_spec("migrate", env)[0] == ["kernelsearch", "db", "upgrade"]
    assert service_spec("api", env)[0] == ["kernelsearch", "serve", "--host", "127.0.0.1",
                                           "--port", "8123", "--no-worker"]
    assert service_spec("worker", env)[0] == ["kernelsearch", "worker"]
    seed = service_spec("seed", env)[0]
    assert seed[:4] == ["kernelsearch", "records", "import", "--if-empty"]


def test_healthchecks_and_restart_policies(compose):
    for name in ("postgres", "api", "worker"):
        svc = compose["services"][name]
        hc = svc["healthcheck"]
        assert hc["test"][0] in ("CMD", "CMD-SHELL") and hc["interval"] and hc["retries"] >= 1, name
        assert svc["restart"] in ("always", "unless-stopped"), name
    for name in ("api", "worker"):
        test = compose["services"][name]["healthcheck"]["test"]
        assert test[1:] == ["python", "-m", "kernelsearch.service.deploy.healthcheck", name], test
    assert (DEPLOY / "healthcheck.py").is_file() and (DEPLOY / "__init__.py").is_file()
    for doc in (compose, load_compose(WORKER_HOST_FILE)):
        assert doc["services"]["worker"]["healthcheck"]["test"][1:] == \
            ["python", "-m", "kernelsearch.service.deploy.healthcheck", "worker"]


@pytest.mark.parametrize("path", [COMPOSE_FILE, WORKER_HOST_FILE], ids=lambda p: p.name)
def test_build_uses_service_dockerfile_from_the_repository_root(path):
    """Compose resolves `context` against the compose file's folder, `dockerfile` against the
    context: both files must land on the repository root and service/Dockerfile."""
    doc = load_compose(path)
    builds = [svc["build"] for svc in doc["services"].values() if "build" in svc]
    assert builds, f"{path.name}: no service builds the image"
    for build in builds:
        context = (path.parent / build["context"]).resolve()
        assert context == ROOT, f"{path.name}: build context {build['context']!r} is not the root"
        assert build["dockerfile"] == "service/Dockerfile"
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE.resolve()
    assert DOCKERFILE.is_file() and not (ROOT / "Dockerfile").exists()


def test_worker_reserves_one_nvidia_gpu(compose):
    (dev,) = _devices(compose["services"]["worker"])
    assert dev["driver"] == "nvidia"
    assert dev["capabilities"] == ["gpu"]
    assert interpolate(dev["device_ids"], {}) == ["0"]
    assert interpolate(dev["device_ids"], {"KS_WORKER_GPU": "3"}) == ["3"]
    assert "count" not in dev, "count and device_ids exclude each other"


@pytest.mark.parametrize("path", [COMPOSE_FILE, WORKER_HOST_FILE], ids=lambda p: p.name)
def test_every_setting_is_a_ks_reference(path):
    doc = load_compose(path)
    for name, svc in doc["services"].items():
        env = svc.get("environment") or {}
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        prefix = "POSTGRES_" if name == "postgres" else "KS_"
        for key, value in env.items():
            assert key.startswith(prefix), f"{name}: {key}"
            assert isinstance(value, str) and re.fullmatch(r"\$\{" + key + r"(:?[-?][^}]*)?\}", value), \
                f"{name}: {key} must be set from ${{{key}...}}, got {value!r}"


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_required_secret_fails_loudly(compose, secret):
    env = {k: v for k, v in SECRETS.items() if k != secret}
    services = [n for n, s in compose["services"].items() if secret in (s.get("environment") or {})]
    assert services, f"no service uses {secret}"
    for name in services:
        with pytest.raises(MissingVariable) as info:
            interpolate(compose["services"][name]["environment"], env)
        assert info.value.name == secret and "set " + secret in info.value.message
    # An empty value counts as unset too.
    with pytest.raises(MissingVariable):
        interpolate(compose["services"][services[0]]["environment"], {**env, secret: ""})


def test_interpolation_rules():
    env = {"A": "a", "E": ""}
    assert interpolate("${A:-x}|${E:-x}|${E-x}|${U-x}|$$A|$A|${A:+y}|${U:+y}", env) == "a|x||x|$A|a|y|"
    with pytest.raises(MissingVariable):
        interpolate("${U?boom}", env)
    assert interpolate("${E?boom}", env) == ""


# ----------------------------------------------------------------------------- docker-compose
def _compose_config(env_over: dict[str, str], *files: Path) -> subprocess.CompletedProcess:
    args = [DOCKER_COMPOSE]
    for f in files or (COMPOSE_FILE,):
        args += ["-f", str(f)]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", **env_over}
    return subprocess.run(args + ["config"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


@needs_compose
def test_docker_compose_config_matches_our_reading():
    env = {**SECRETS, "KS_API_PORT": "8123", "KS_MEASURE_N": "7"}
    out = _compose_config(env)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)["services"]
    for name in APP_SERVICES:
        argv, environment = service_spec(name, env)
        assert [str(a) for a in resolved[name]["command"]] == argv, name
        assert {k: str(v) for k, v in resolved[name]["environment"].items()} == environment, name
    assert resolved["worker"]["environment"]["KS_MEASURE_N"] == "7"


@needs_compose
@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_docker_compose_refuses_without_secret(secret):
    out = _compose_config({k: v for k, v in SECRETS.items() if k != secret})
    assert out.returncode != 0
    assert secret in out.stderr


@needs_compose
def test_docker_compose_accepts_worker_host_file():
    out = _compose_config({"KS_DATABASE_URL": SECRETS["KS_DATABASE_URL"]}, WORKER_HOST_FILE)
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert list(services) == ["worker"] and "depends_on" not in services["worker"]


# ----------------------------------------------------------------------------- GPU override
def test_gpu_override_pins_one_worker_per_gpu(compose):
    override = _gpu_workers().gpu_override(compose, 4)
    names = sorted(override["services"])
    assert names == ["worker-gpu1", "worker-gpu2", "worker-gpu3"]
    ids = [_devices(override["services"][n])[0]["device_ids"] for n in names]
    assert ids == [["1"], ["2"], ["3"]]
    for n in names:
        svc = override["services"][n]
        assert svc["command"] == compose["services"]["worker"]["command"]
        assert svc["environment"] == compose["services"]["worker"]["environment"]
    assert _gpu_workers().gpu_override(compose, 1) == {"services": {}}
    with pytest.raises(ValueError, match="n_gpus"):
        _gpu_workers().gpu_override(compose, 0)
    with pytest.raises(ValueError, match="no service 'nope'"):
        _gpu_workers().gpu_override(compose, 2, "nope")


def test_gpu_workers_cli_rejects_bad_count():
    out = _module_cli("kernelsearch.service.deploy.gpu_workers", "--gpus", "two")
    assert out.returncode == 2 and "--gpus must be an integer" in out.stderr


def test_healthcheck_module_cli():
    """`python -m kernelsearch.service.deploy.healthcheck` as the compose files run it: usage error without a
    check name, and an unhealthy answer (exit 1) when nothing listens on the API port."""
    out = _module_cli("kernelsearch.service.deploy.healthcheck")
    assert out.returncode == 2 and "usage: python -m kernelsearch.service.deploy.healthcheck" in out.stderr
    with socket.socket() as s:  # a port that was free a moment ago, now closed again
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _module_cli("kernelsearch.service.deploy.healthcheck", "api",
                      env={"PATH": "/usr/bin:/bin", "KS_API_PORT": str(port)})
    assert out.returncode == 1 and "unreachable" in out.stderr, out.stderr


@needs_compose
def test_docker_compose_merges_gpu_override(tmp_path):
    out = _module_cli("kernelsearch.service.deploy.gpu_workers", "--gpus", "3", check=True)
    override = ROOT / f".ks-test-gpus-{tmp_path.name}.yml"  # beside the base file, as documented
    override.write_text(out.stdout)
    try:
        res = _compose_config(SECRETS, COMPOSE_FILE, override)
    finally:
        override.unlink()
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    ids = sorted(_devices(services[n])[0]["device_ids"][0]
                 for n in ("worker", "worker-gpu1", "worker-gpu2"))
    assert ids == ["0", "1", "2"]


# ----------------------------------------------------------------------------- Dockerfile
def _dockerfile() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln.strip() else "")
            for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule for a top-level path: the last matching pattern wins, `!` re-includes."""
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if rel.split("/")[0] == pat or fnmatch.fnmatch(rel, pat) \
                or fnmatch.fnmatch(rel, pat.removeprefix("**/")):
            ignored = not neg
    return ignored


def test_dockerfile_builds_from_cuda_with_torch_and_triton():
    instr = _dockerfile()
    args = dict(a.split("=", 1) for i, a in instr if i == "ARG" and "=" in a)
    first_from = next(a for i, a in instr if i == "FROM")
    base = interpolate(first_from, args)
    assert base.startswith("nvidia/cuda:"), base
    runs = " ".join(a for i, a in instr if i == "RUN")
    assert "torch==${TORCH_VERSION}" in runs and "triton==${TRITON_VERSION}" in runs
    assert args["TRITON_VERSION"] == "3.6.0"
    assert "gcc" in runs and "python3-dev" in runs, "Triton compiles its launcher at run time"
    user = [a for i, a in instr if i == "USER"]
    assert user and user[-1] not in ("root", "0"), "the service runs unprivileged"
    cmd = json.loads(next(a for i, a in instr if i == "CMD"))
    assert cmd[:2] == ["kernelsearch", "serve"]


def test_dockerfile_copies_exist_and_are_not_ignored():
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    copies = [a.split() for i, a in _dockerfile() if i == "COPY"]
    assert copies
    sources = [s for c in copies for s in c[:-1] if not s.startswith("--")]
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: missing in the repository"
        assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
    assert "service" in sources and (DEPLOY / "healthcheck.py").is_file(), \
        "the healthcheck module (service.deploy.healthcheck) must be in the image"
    assert not any(s.split("/")[0] in ("deploy", "scripts") for s in sources), sources
    assert _ignored(".git", patterns) and _ignored("tests", patterns)
