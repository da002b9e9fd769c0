"""The CLI with only the service's address (KS_SERVICE_URL, --service URL or --url http://...):
`kernels NAME`, `records list`, `records export` and `search` answer through the REST API as
they do with the database's URL, the same output, and the service's settings decide (its
search budget), its writer token where they write."""
from __future__ import annotations

import json
from typing import Iterator

import pytest
from pydantic import SecretStr
from svc_helpers import LiveServer, record, settings_for
from test_search_jobs import CASE, NAME, _capture, _definition
from trusted_records import trusted
from typer.testing import CliRunner

from kernelsearch.kernels.registry import unregister
from kernelsearch.service.api import create_app
from kernelsearch.service.cli import app
from kernelsearch.service.definitions import register_definition

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("isolated_client")]
runner = CliRunner()
KA = "vision_rope_generation_bwd"


@pytest.fixture
def served(sqlite_store, monkeypatch) -> Iterator[tuple[object, str]]:
    """A store with records, an undeclared kernel and a stored call, behind a live service with a
    writer token and a search budget of 6; the CLI's environment names no database."""
    sqlite_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 5.0)))
    sqlite_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 4.0)))
    sqlite_store.save_definition(NAME, _definition())
    register_definition(_definition(), sqlite_store)
    sqlite_store.queue_job(NAME, [CASE], 5, "grid", None, None, _capture())
    settings = settings_for(sqlite_store.url, api_token=SecretStr("tok"), search_trials=6,
                            job_modules=["ks_undeclared_user"])
    with LiveServer(create_app(settings, store=sqlite_store)) as server:
        monkeypatch.delenv("KS_DATABASE_URL", raising=False)
        monkeypatch.setenv("KS_API_TOKEN", "tok")
        monkeypatch.setenv("KS_SEARCH_TRIALS", "64")  # the CLI's own: the service's decides
        yield sqlite_store, server.url


def _run(*args: str, env: dict[str, str] | None = None):
    got = runner.invoke(app, list(args), env=env)
    assert got.exit_code == 0, got.output
    return got.stdout


@pytest.mark.parametrize("how", ["env", "--service", "--url"])
def test_records_list_and_export_answer_as_from_the_database(served, how, tmp_path) -> None:
    store, url = served
    db = ["--url", store.url]

    def through(*args: str) -> str:
        if how == "env":
            return _run(*args, env={"KS_SERVICE_URL": url})
        if how == "--service":
            return _run("--service", url, *args)
        return _run(*args, "--url", url)

    for args in (["records", "list"], ["records", "list", "--history"],
                 ["records", "list", "--json", "--kernel", KA]):
        assert through(*args) == _run(*args, *db), args
    remote, local = (json.loads(t) for t in (through("records", "export", "--history", "-"),
                                             _run("records", "export", "--history", "-", *db)))
    remote.pop("exported_at"), local.pop("exported_at")
    assert remote == local and len(remote["records"]) == 2
    unregister(NAME)  # known here only as the service tells it
    assert through("kernels", NAME) == _run("kernels", NAME, *db)


def test_search_through_the_service_uses_its_budget_and_token(served) -> None:
    _, url = served
    got = json.loads(_run("search", "--from-captures", "--json", env={"KS_SERVICE_URL": url}))
    assert [(r["kernel"], r["n_trials"], r["new"]) for r in got] == [(NAME, 6, True)]
    refused = runner.invoke(app, ["search", "--from-captures"],
                            env={"KS_SERVICE_URL": url, "KS_API_TOKEN": "wrong"})
    assert refused.exit_code == 1 and "set KS_API_TOKEN" in refused.output


def test_tune_through_the_service_shares_its_records(served) -> None:
    """`tune` runs here, in a scratch store, and uploads what it stored: the service then
    holds the record, as `tune --url DATABASE` would have stored it."""
    from kernelsearch.kernels.device import INTERPRETER_DEVICE

    store, url = served
    out = _run("tune", KA, "--case", "total_patches=2", "--trials", "1", "--sampler", "random",
               "--seed", "1", "--measure-n", "1", env={"KS_SERVICE_URL": url, "COLUMNS": "300"})
    assert f"shared 1 record(s) with the service at {url}" in out
    (rec,) = store.list_records(KA, INTERPRETER_DEVICE)
    assert rec.axes == {"total_patches": 2} and rec.origin == "upload"
    undeclared = runner.invoke(app, ["tune", NAME], env={"KS_SERVICE_URL": url})
    assert undeclared.exit_code == 2 and "give --url DATABASE" in undeclared.output
