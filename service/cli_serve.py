"""`kernelsearch serve` (the API, with a worker in a child process by default) and `kernelsearch worker`."""
from __future__ import annotations

import logging
import signal
import threading

import typer

from .settings import Settings, SettingsError, load_settings
from .worker_process import SCHEMA_CHECKED_FLAG


def _check_schema_or_exit(settings: Settings) -> None:
    """Refuse to start on a database whose schema is not this code's, saying what to run."""
    from kernelsearch.db.engine import check_schema, make_engine
    from kernelsearch.db.errors import SchemaBehind, StoreUnavailable

    from .cli_db import missing_file

    missing = missing_file(settings.database_url)
    if missing is not None:  # opening it would create an empty, unmigrated file
        typer.echo(f"error: {missing}", err=True)
        raise typer.Exit(2)
    engine = make_engine(settings.database_url)
    try:
        check_schema(engine)
    except SchemaBehind as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except StoreUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(3) from None
    finally:
        engine.dispose()


def _settings_or_exit() -> Settings:
    """The settings, or a message naming the bad KS_* variables and exit 2 (never a traceback)."""
    try:
        return load_settings()
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def register(app: typer.Typer) -> None:
    """Add `serve` and `worker` to the main app."""

    @app.command()
    def serve(
        host: str = typer.Option("127.0.0.1", help="address to listen on"),
        port: int = typer.Option(8000, min=1, max=65535, help="port to listen on"),
        no_worker: bool = typer.Option(False, "--no-worker",
                                       help="API only: run workers with `kernelsearch worker`"),
    ) -> None:
        """Run the REST API and dashboard; with an embedded worker unless --no-worker. On a
        loopback address only Host localhost, 127.0.0.1 or [::1] with the port is answered."""
        import uvicorn

        from .api import create_app
        from .cli_optuna import is_loopback
        from .strict_input import loopback_hosts

        settings = _settings_or_exit()
        _logging(settings)
        _check_schema_or_exit(settings)  # the only check: the app and its worker child skip theirs
        app_ = create_app(settings, start_worker=not no_worker,
                          worker_process=settings.serve_worker == "process",
                          trusted_hosts=loopback_hosts(port) if is_loopback(host) else None,
                          schema_checked=True)
        uvicorn.run(app_, host=host, port=port, log_level=settings.log_level.lower(),
                    access_log=False)

    @app.command()
    def worker(
        once: bool = typer.Option(False, "--once", help="run at most one job, then exit"),
        schema_checked: bool = typer.Option(False, SCHEMA_CHECKED_FLAG, hidden=True,
                                            help="started by `serve`, which checked the schema"),
    ) -> None:
        """Claim and tune queued jobs (one at a time) until SIGTERM or Ctrl-C."""
        from .worker_runner import WorkerRunner

        settings = _settings_or_exit()
        _logging(settings)
        if not schema_checked:
            _check_schema_or_exit(settings)
        runner = WorkerRunner(settings)
        typer.echo(f"worker {runner.owner} on {runner.store!r}")
        stop = threading.Event()

        def _stop(signum: int, _frame: object) -> None:
            logging.getLogger(__name__).info("signal %d: stopping after the current trial", signum)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if once:
            ran = runner.run_one(stop)
            typer.echo("ran one job" if ran else "no queued job")
        else:
            runner.run_forever(stop)
