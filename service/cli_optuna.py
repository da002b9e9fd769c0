"""`kernelsearch optuna-dashboard`: optuna-dashboard as a sidecar on the service's database.

It shows what the kernelsearch dashboard does not (parallel coordinates, parameter importance,
the raw trials of each study). Its write routes (rename, delete, tell, notes) have no
authentication of their own, so: while the service has a token (KS_API_TOKEN), every request but
GET and HEAD needs `Authorization: Bearer <token>`, wherever it binds; it binds to loopback by
default, and a non-loopback host is refused without a token; on loopback, a Host header other
than localhost/127.0.0.1/[::1] with the port is refused (a browser page reaching it through
DNS rebinding). `/ks/study?name=...` redirects to a study by its name: the case pages link
there, since they know study names and not Optuna's study ids.
"""
from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any, Optional
from urllib.parse import parse_qs, quote

import typer

SAFE_METHODS = ("GET", "HEAD")
StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class UnsafeBind(ValueError):
    """A non-loopback host without a token: optuna-dashboard's writes would be open to the network."""


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def check_bind(host: str, token: str | None) -> bool:
    """Whether writes must carry the token (whenever one is set); UnsafeBind for a non-loopback
    host without one."""
    if token:
        return True
    if is_loopback(host):
        return False
    raise UnsafeBind(
        f"--host {host}: not a loopback address, and optuna-dashboard's write routes have no "
        "authentication; set KS_API_TOKEN (writes then need it) or bind to 127.0.0.1")


def _reply(start_response: StartResponse, status: str, body: str,
           headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data)))] + (headers or []))
    return [data]


def sidecar_app(storage: Any, *, token: str | None, guard_writes: bool,
                allowed_hosts: frozenset[str] | None = None) -> WSGIApp:
    """optuna-dashboard over `storage` (an Optuna storage), with the study-name redirect; when
    guard_writes, the bearer token required for every request that is not a read; with
    allowed_hosts (a loopback bind), any other Host header refused 400."""
    import optuna_dashboard

    from .strict_input import host_allowed

    inner = optuna_dashboard.wsgi(storage)
    expected = token.encode() if token else b""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        if allowed_hosts is not None and not host_allowed(environ.get("HTTP_HOST"), allowed_hosts):
            return _reply(start_response, "400 Bad Request",
                          "this server listens on loopback and answers only Host "
                          f"{', '.join(sorted(allowed_hosts))}\n")
        if guard_writes and method not in SAFE_METHODS:
            auth = environ.get("HTTP_AUTHORIZATION", "")
            given = auth[7:].encode() if auth[:7].lower() == "bearer " else b""
            if not (given and hmac.compare_digest(given, expected)):
                return _reply(start_response, "401 Unauthorized",
                              "writes need Authorization: Bearer <KS_API_TOKEN>\n",
                              [("WWW-Authenticate", "Bearer")])
        if environ.get("PATH_INFO", "").rstrip("/") == "/ks/study":
            return _study_redirect(storage, environ, start_response)
        return inner(environ, start_response)

    return app


def _study_redirect(storage: Any, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
    from optuna.exceptions import OptunaError

    name = (parse_qs(environ.get("QUERY_STRING", "")).get("name") or [""])[0]
    if not name:
        return _reply(start_response, "422 Unprocessable Entity", "name: give the study's name\n")
    try:
        study_id = storage.get_study_id_from_name(name)
    except (KeyError, OptunaError):
        return _reply(start_response, "404 Not Found",
                      f"no study named {name!r} in this database (imported records keep the name "
                      "of the study that tuned them elsewhere)\n")
    return _reply(start_response, "302 Found", f"/dashboard/studies/{study_id}\n",
                  [("Location", f"/dashboard/studies/{quote(str(study_id))}")])


def optuna_dashboard(
    url: Optional[str] = typer.Option(None, "--url", help="database URL (default: KS_DATABASE_URL)"),
    host: str = typer.Option("127.0.0.1", "--host",
                             help="address to bind; a non-loopback one needs KS_API_TOKEN"),
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="port to listen on"),
) -> None:
    """Serve optuna-dashboard on the service's database (the studies of every tuned case)."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from optuna.storages import RDBStorage

    from kernelsearch.db.engine import DatabaseURLError, engine_kwargs, parse_database_url

    from .errors import redact
    from .settings import SettingsError, load_settings
    from .strict_input import loopback_hosts

    try:
        settings = load_settings()
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    token = settings.api_token.get_secret_value() if settings.api_token else None
    try:
        guard = check_bind(host, token)
    except UnsafeBind as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    db_url = url or settings.database_url
    try:
        parse_database_url(db_url)
    except DatabaseURLError as exc:
        typer.echo(f"error: {'--url' if url else 'KS_DATABASE_URL'}: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        storage = RDBStorage(db_url, engine_kwargs=engine_kwargs(db_url))
    except Exception as exc:  # Optuna connects and creates its tables here: say why, in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        typer.echo(f"error: cannot open the database: {redact(first)}", err=True)
        raise typer.Exit(1) from None

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

    hosts = loopback_hosts(port) if is_loopback(host) else None
    app = sidecar_app(storage, token=token, guard_writes=guard, allowed_hosts=hosts)
    try:
        httpd = make_server(host, port, app, server_class=Server, handler_class=QuietHandler)
    except OSError as exc:
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        raise typer.Exit(1) from None
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"optuna-dashboard on http://{shown}:{port}/ "
               f"({'writes need the token' if guard else 'loopback only, no token set'}); "
               "Ctrl-C stops it")
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("optuna-dashboard")(optuna_dashboard)
