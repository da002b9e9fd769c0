"""A result with nowhere to go is said once, with the fix: no service and no store, a local
store that does not exist, a service address that is not one (KS_SERVICE_URL ending in /v1 is
taken as the service's), a writer token the service refuses."""
from __future__ import annotations

import logging

import pytest
import torch
from ks_at_helpers import accumulate, accumulate_kernel

from kernelsearch import backends
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.options import Source

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for k in ("KS_SERVICE_URL", "KS_AUTOTUNE_SYNC", "KS_API_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    monkeypatch.setenv("KS_AUTOTUNE_TIMEOUT_S", "10")
    monkeypatch.setenv("KS_PROVIDER_TIMEOUT_S", "10")
    backends.BACKENDS.reset()
    accumulate_kernel.forget()


def _warnings(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and words in r.getMessage()]


def test_no_service_and_no_store_is_said_once(monkeypatch, caplog, tmp_path) -> None:
    absent = tmp_path / "absent.db"
    monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{absent}")
    with caplog.at_level(logging.WARNING):
        accumulate(torch.randn(100))
        accumulate(torch.randn(300))
        backends.BACKENDS.drain(30)
    (line,) = _warnings(caplog, "nowhere to go")
    assert f"the local store {absent} does not exist" in line
    assert "KS_SERVICE_URL" in line and "kernelsearch db upgrade" in line


def _server(at_store, **kw):
    from svc_helpers import LiveServer, settings_for

    from kernelsearch.service.api import create_app

    return LiveServer(create_app(settings_for(at_store.url, **kw), store=at_store))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_named_local_store_that_does_not_exist_is_said(at_store, monkeypatch, caplog,
                                                         tmp_path) -> None:
    absent = tmp_path / "typo.db"
    with _server(at_store) as server, caplog.at_level(logging.WARNING):
        monkeypatch.setenv("KS_SERVICE_URL", server.url)
        monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{absent}")
        accumulate(torch.randn(100))
        backends.BACKENDS.drain(30)
    (line,) = _warnings(caplog, "does not exist")
    assert f"KS_DATABASE_URL names {absent}" in line and "kernelsearch db upgrade" in line
    assert [j.cases for j in at_store.list_jobs()] == [[{"n": 100}]]  # the service still has it


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_service_url_ending_in_v1_is_the_services(at_store, monkeypatch, tmp_path) -> None:
    from svc_like import put_record
    from ks_at_helpers import KERNEL

    second = KERNEL.space_configs[1]
    put_record(at_store, KERNEL, {"n": 100}, second, device=INTERPRETER_DEVICE)
    with _server(at_store) as server:
        monkeypatch.setenv("KS_SERVICE_URL", server.url + "/v1/")
        monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
        accumulate(torch.randn(100))
    assert list(accumulate_kernel.sources.values()) == [Source.SERVICE]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_address_that_is_no_service_is_said(at_store, monkeypatch, caplog, tmp_path) -> None:
    with _server(at_store) as server, caplog.at_level(logging.WARNING):
        monkeypatch.setenv("KS_SERVICE_URL", server.url + "/api")
        monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
        accumulate(torch.randn(100))
        backends.BACKENDS.drain(30)
    (line,) = _warnings(caplog, "is not a kernelsearch service's address")
    assert "KS_SERVICE_URL" in line and "http://127.0.0.1:8000" in line


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_refused_token_is_said_once_with_the_fix(at_store, monkeypatch, caplog,
                                                   tmp_path) -> None:
    from pydantic import SecretStr

    with _server(at_store, api_token=SecretStr("right")) as server, \
            caplog.at_level(logging.WARNING):
        monkeypatch.setenv("KS_SERVICE_URL", server.url)
        monkeypatch.setenv("KS_API_TOKEN", "wrong")
        monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
        accumulate(torch.randn(100))
        accumulate(torch.randn(300))
        backends.BACKENDS.drain(30)
    (line,) = _warnings(caplog, "writer token")
    assert "set KS_API_TOKEN to the service's KS_API_TOKEN" in line
    assert at_store.list_jobs() == []


def test_an_unreachable_service_says_the_fix(monkeypatch, caplog, tmp_path) -> None:
    from svc_helpers import free_port

    monkeypatch.setenv("KS_SERVICE_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    with caplog.at_level(logging.WARNING):
        accumulate(torch.randn(100))
        backends.BACKENDS.drain(30)
    (line,) = _warnings(caplog, "service unreachable")
    assert "start it, or set KS_SERVICE_URL to its address" in line
