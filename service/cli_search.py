"""`kernelsearch search --from-captures`: a search job beyond the config list for every
key a program's captured calls met, so a fleet's kernels get searched while it runs."""
from __future__ import annotations

import json
from typing import Any, Optional

import typer


def search(
    from_captures: bool = typer.Option(False, "--from-captures",
                                       help="queue a search for every key a stored call met"),
    kernel: Optional[str] = typer.Option(None, "--kernel", help="only this undeclared kernel's keys"),
    url: Optional[str] = typer.Option(None, "--url", help="database URL or the service's http(s) "
                                      "address (default KS_DATABASE_URL, else KS_SERVICE_URL)"),
    as_json: bool = typer.Option(False, "--json", help="print the queued jobs as JSON"),
) -> None:
    """Queue search jobs (budget per key: KS_SEARCH_TRIALS configs, KS_SEARCH_S: the
    service's own through its REST API, with --url http://... or KS_SERVICE_URL alone)."""
    from kernelsearch.db.errors import StoreError
    from kernelsearch.db.store import Store

    from .cli_remote import service_url
    from .search_jobs import queue_searches
    from .settings import SettingsError, get_settings

    if not from_captures:
        typer.echo("error: say what to search: --from-captures (every key a stored call met)",
                   err=True)
        raise typer.Exit(2)
    base = service_url(url)
    if base is not None:
        _show(_search_service(base, kernel), as_json)
        return
    try:
        settings = get_settings()
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        with Store(url or settings.database_url) as store:
            queued = queue_searches(store, settings, kernel)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    _show([{"id": j.id, "kernel": j.kernel, "case": j.cases[0], "n_trials": j.n_trials,
            "new": new} for j, new in queued], as_json)


def _search_service(base: str, kernel: str | None) -> list[dict[str, Any]]:
    """POST /v1/search: the service's budget (its KS_SEARCH_TRIALS) decides, as for its workers."""
    from kernelsearch.rest_client import ClientError

    from .cli_remote import client, fail

    try:
        with client(base) as c:
            jobs = c.search(kernel)
    except ClientError as exc:
        raise fail(exc) from None
    return [{"id": j["id"], "kernel": j["kernel"], "case": j["cases"][0],
             "n_trials": j["n_trials"], "new": not j.get("existing")} for j in jobs]


def _show(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo("no stored call to search from")
    for r in rows:
        typer.echo(f"job {r['id']}: {r['kernel']} {r['case']} ({r['n_trials']} configs"
                   f"{'' if r['new'] else ', already queued'})")


def register(app: typer.Typer) -> None:
    app.command("search")(search)
