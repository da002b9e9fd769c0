"""Which store a CLI command reads and writes: a database (`--url DB`, KS_DATABASE_URL), or the
service's REST API (`--url http://...`, `--service URL`, or KS_SERVICE_URL when no database is
named), so a host with only the service's address uses the same commands."""
from __future__ import annotations

import os

import typer

from kernelsearch.rest_client import Client, ClientError

# A command's whole run through the service, not one lookup's bound.
CLI_TIMEOUT_S = 60.0


def service_url(url: str | None) -> str | None:
    """The service a command speaks to, or None for a database: `--url` when it is an http(s)
    address, else KS_SERVICE_URL (`--service`) when neither `--url` nor KS_DATABASE_URL names a
    database."""
    if url:
        return url if url.startswith(("http://", "https://")) else None
    if os.environ.get("KS_DATABASE_URL"):
        return None
    from .client_settings import client_settings

    return client_settings().service_url


def client(base_url: str) -> Client:
    """A client of the service with the writer token (KS_API_TOKEN) for the commands that write."""
    from .client_settings import client_settings

    st = client_settings()
    token = st.api_token.get_secret_value() if st.api_token else None
    return Client(base_url, token=token, timeout=CLI_TIMEOUT_S)


def fail(exc: ClientError) -> typer.Exit:
    """The service's answer as the command's error (exit 1); a refused token says the fix."""
    hint = "; set KS_API_TOKEN to the service's writer token" if exc.status == 401 else ""
    typer.echo(f"error: {exc.message}{hint}", err=True)
    return typer.Exit(1)
