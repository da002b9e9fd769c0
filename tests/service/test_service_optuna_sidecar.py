"""`kernelsearch optuna-dashboard`: loopback by default, a non-loopback host only behind the
token (optuna-dashboard's own write routes have no authentication), every write behind the token
once one is set, a foreign Host refused on loopback (the API's `serve` too), studies by name."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import optuna
import pytest
from svc_helpers import free_port
from typer.testing import CliRunner

from kernelsearch.service.cli import app as cli
from kernelsearch.service.cli_optuna import UnsafeBind, check_bind, is_loopback, sidecar_app
from kernelsearch.service.settings import get_settings
from kernelsearch.service.strict_input import loopback_hosts

TOKEN = "s3cret-token"


def _storage(url: str) -> optuna.storages.RDBStorage:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="ks/k/n=8/dev", storage=storage)
    study.optimize(lambda t: t.suggest_int("BLOCK", 1, 8), n_trials=2)
    return storage


def _client(storage, **kw) -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=sidecar_app(storage, **kw)),
                        base_url="http://sidecar")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts_need_no_token(host: str) -> None:
    assert is_loopback(host)
    assert check_bind(host, None) is False


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1"])
def test_other_hosts_are_refused_without_the_token(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(UnsafeBind, match="KS_API_TOKEN"):
        check_bind(host, None)
    with pytest.raises(UnsafeBind):
        check_bind(host, "")
    assert check_bind(host, TOKEN) is True


def test_cli_refuses_a_public_host_without_a_token(sqlite_url: str) -> None:
    get_settings.cache_clear()
    try:
        res = CliRunner().invoke(cli, ["optuna-dashboard", "--url", sqlite_url, "--host", "0.0.0.0"],
                                 env={"KS_API_TOKEN": ""})
    finally:
        get_settings.cache_clear()  # the settings read under this test's environment
    assert res.exit_code == 2
    assert "not a loopback address" in res.output


def test_writes_need_the_token_when_guarded(sqlite_url: str) -> None:
    storage = _storage(sqlite_url)
    sid = storage.get_study_id_from_name("ks/k/n=8/dev")
    with _client(storage, token=TOKEN, guard_writes=True) as c:
        assert c.get("/api/studies").status_code == 200  # reads stay open
        rename = f"/api/studies/{sid}/rename"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}x"},
                        {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"Authorization": TOKEN}):
            r = c.post(rename, json={"study_name": "hijacked"}, headers=headers)
            assert r.status_code == 401, headers
        assert c.delete(f"/api/studies/{sid}").status_code == 401
        assert [s.study_name for s in storage.get_all_studies()] == ["ks/k/n=8/dev"]
        r = c.post(rename, json={"study_name": "renamed"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
        assert [s.study_name for s in storage.get_all_studies()] == ["renamed"]


def test_study_by_name_redirects_to_its_page(sqlite_url: str) -> None:
    storage = _storage(sqlite_url)
    sid = storage.get_study_id_from_name("ks/k/n=8/dev")
    with _client(storage, token=None, guard_writes=False) as c:
        r = c.get("/ks/study", params={"name": "ks/k/n=8/dev"})
        assert r.status_code == 302 and r.headers["location"] == f"/dashboard/studies/{sid}"
        assert c.get("/ks/study", params={"name": "nope"}).status_code == 404
        assert c.get("/ks/study").status_code == 422
        assert c.get(f"/api/studies/{sid}").json()["name"] == "ks/k/n=8/dev"


def test_command_serves_the_database(sqlite_url: str) -> None:
    _storage(sqlite_url)
    port = free_port()
    env = {**os.environ, "KS_API_TOKEN": ""}
    proc = subprocess.Popen([sys.executable, "-m", "kernelsearch.service.cli", "optuna-dashboard",
                             "--url", sqlite_url, "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "the sidecar never answered"
                time.sleep(0.2)
        assert r.status_code == 200
        assert [s["study_name"] for s in r.json()["study_summaries"]] == ["ks/k/n=8/dev"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_loopback_writes_need_the_token_once_one_is_set(sqlite_url: str) -> None:
    """KS_API_TOKEN set, bound to loopback: a write without the token is refused all the same
    (a browser page or another local user reaches loopback too)."""
    storage = _storage(sqlite_url)
    sid = storage.get_study_id_from_name("ks/k/n=8/dev")
    assert check_bind("127.0.0.1", TOKEN) is True
    app = sidecar_app(storage, token=TOKEN, guard_writes=check_bind("127.0.0.1", TOKEN),
                      allowed_hosts=loopback_hosts(8080))
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://127.0.0.1:8080") as c:
        assert c.delete(f"/api/studies/{sid}").status_code == 401
        assert c.options(f"/api/studies/{sid}").status_code == 401
        assert c.get("/api/studies").status_code == 200
        assert [s.study_name for s in storage.get_all_studies()] == ["ks/k/n=8/dev"]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.nip.io:8080",
                                  "localhost:9999", "[::2]:8080", ""])
def test_loopback_refuses_a_foreign_host(sqlite_url: str, host: str) -> None:
    storage = _storage(sqlite_url)
    sid = storage.get_study_id_from_name("ks/k/n=8/dev")
    app = sidecar_app(storage, token=None, guard_writes=False, allowed_hosts=loopback_hosts(8080))
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://127.0.0.1:8080") as c:
        r = c.delete(f"/api/studies/{sid}", headers={"Host": host})
        assert r.status_code == 400, r.text
        assert c.get("/api/studies", headers={"Host": host}).status_code == 400
        assert [s.study_name for s in storage.get_all_studies()] == ["ks/k/n=8/dev"]
        for good in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080"):
            assert c.get("/api/studies", headers={"Host": good}).status_code == 200, good


def test_a_good_write_passes_the_token_and_host_checks(sqlite_url: str) -> None:
    storage = _storage(sqlite_url)
    sid = storage.get_study_id_from_name("ks/k/n=8/dev")
    app = sidecar_app(storage, token=TOKEN, guard_writes=True, allowed_hosts=loopback_hosts(8080))
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://localhost:8080") as c:
        r = c.post(f"/api/studies/{sid}/rename", json={"study_name": "renamed"},
                   headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
    assert [s.study_name for s in storage.get_all_studies()] == ["renamed"]


def test_the_api_on_loopback_checks_host_too(sqlite_store) -> None:
    from fastapi.testclient import TestClient
    from svc_helpers import settings_for

    from kernelsearch.service.api import create_app

    app = create_app(settings_for(sqlite_store.url), store=sqlite_store,
                     trusted_hosts=loopback_hosts(8000))
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/healthz").status_code == 200
        for host in ("evil.example", "evil.example:8000", "127.0.0.1:8001"):
            r = c.get("/healthz", headers={"Host": host})
            assert r.status_code == 400 and "loopback" in r.json()["detail"], host
            assert c.post("/v1/jobs", json={}, headers={"Host": host}).status_code == 400
        assert c.get("/v1/kernels", headers={"Host": "[::1]:8000"}).status_code == 200
