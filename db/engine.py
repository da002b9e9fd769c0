"""Engines for SQLite and PostgreSQL, Alembic run from code, and the schema check at startup."""
from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, exc, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import StaticPool
from tenacity import Retrying, before_sleep_log, retry_if_exception, stop_after_delay, wait_exponential_jitter

from .errors import SchemaBehind, StoreUnavailable

log = logging.getLogger(__name__)

VERSION_TABLE = "ks_alembic_version"
UPGRADE_HINT = "run `kernelsearch db upgrade`"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 5
# user:password@ in a URL; the password may hold "@" (the host is what follows the last one).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][\w+.-]*://[^:/@\s]+):\S*?@(?=[^@\s/]*(?:[/\s?#]|$))")
# Any constant works: it only has to be the same for every process upgrading one database.
_PG_MIGRATION_LOCK = 0x6B735F6D6967


def redact_url_passwords(text: str) -> str:
    """`text` with the password of every URL in it replaced by ***, for logs and error answers
    (a driver's error may quote the database URL)."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


class DatabaseURLError(ValueError):
    """A database URL that cannot be used as written; the message never quotes its password."""


def parse_database_url(url: object) -> URL:
    """The parsed URL of a database this code can open, or DatabaseURLError saying, in one line
    that quotes no password, what is wrong: not a URL, a raw "@" in the password (SQLAlchemy
    would read what follows it as the host), a port that is not a number, a database or driver
    this code cannot use."""
    if not isinstance(url, str) or not url.strip():
        raise DatabaseURLError("database URL: empty; expected e.g. sqlite:///var/kernelsearch.db "
                               "or postgresql+psycopg://user:password@host:5432/db")
    try:
        parsed = make_url(url)
    except exc.ArgumentError:
        raise DatabaseURLError("database URL: not of the form driver://user:password@host:port/"
                               "database (e.g. postgresql+psycopg://... or sqlite:///path)") from None
    except ValueError:
        raise DatabaseURLError("database URL: the port is not a number (or the password holds a "
                               "raw '@' or ':'; percent-encode them as %40 and %3A)") from None
    if parsed.host and "@" in parsed.host:
        raise DatabaseURLError("database URL: the password holds a raw '@'; percent-encode it "
                               "as %40 (user:p%40ss@host)")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise DatabaseURLError(f"database URL: port {parsed.port} is outside 1..65535")
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise DatabaseURLError(f"database URL: unsupported database {backend[:40]!r}; use "
                               "sqlite:/// or postgresql+psycopg://")
    try:
        parsed.get_dialect()
    except (exc.ArgumentError, ImportError):
        raise DatabaseURLError(f"database URL: unknown driver {parsed.drivername[:60]!r}; use "
                               "sqlite:/// or postgresql+psycopg://") from None
    return parsed


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def _is_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or str(url.database).startswith("file::memory:")


# No transaction of this code waits on anything but the database; one idle this long belongs to a
# process that stopped or lost its network, and the server ends it (its locks go with it).
IDLE_IN_TRANSACTION_TIMEOUT_MS = 30_000


def pg_connect_args(*, statement_timeout_ms: int | None = None,
                    lock_timeout_ms: int | None = None) -> dict[str, Any]:
    """libpq options every PostgreSQL engine gets (the store's and Optuna's): a connect timeout,
    TCP keepalives so a peer that vanished mid-connection is noticed instead of waited on
    forever, a server-side end to a transaction left idle (a partitioned worker's open
    transaction would otherwise hold its row locks, and every other worker behind them, until the
    partition heals), and optionally statement and lock timeouts (the lookup path's bound)."""
    args: dict[str, Any] = {
        "connect_timeout": PG_CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    opts = [f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS}"]
    if statement_timeout_ms:
        opts.append(f"-c statement_timeout={int(statement_timeout_ms)}")
    if lock_timeout_ms:
        opts.append(f"-c lock_timeout={int(lock_timeout_ms)}")
    if opts:
        args["options"] = " ".join(opts)
    return args


def engine_kwargs(url: str | URL) -> dict[str, Any]:
    """create_engine() keyword arguments for a URL that another library opens (Optuna's
    RDBStorage): pre-ping and, on PostgreSQL, pg_connect_args() less what the URL sets itself."""
    parsed = parse_database_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() != "postgresql":
        return {}
    args = {k: v for k, v in pg_connect_args().items() if k not in parsed.query}
    return {"pool_pre_ping": True, "connect_args": args}


def is_transient(err: BaseException) -> bool:
    """True for a failure that a retry may cure: a dropped or refused connection, a server
    timeout, a locked SQLite file, an exhausted pool, also when wrapped (Optuna's
    StorageInternalError keeps the driver's error as its cause). A missing table or a bad
    statement is not transient."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, SchemaBehind):
            return False
        # PendingRollbackError: a session reused after its connection dropped mid-transaction
        # (Optuna's "slower alternative" query after a failed one).
        if isinstance(e, (StoreUnavailable, exc.TimeoutError, exc.PendingRollbackError)):
            return True
        if isinstance(e, exc.DBAPIError):
            if _missing_table(e):
                return False
            if e.connection_invalidated or isinstance(e, (exc.OperationalError,
                                                          exc.InterfaceError)):
                return True
            return False
        if type(e).__module__.startswith(("psycopg", "sqlite3")) and type(e).__name__ in (
                "OperationalError", "InterfaceError"):
            return True
        e = e.__cause__
    return False


def retrying(budget_s: float) -> Retrying:
    """The one retry policy for transient database failures: exponential backoff with jitter
    (0.1 s doubling to 2 s), given up after `budget_s` seconds, the last error re-raised."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(max(0.0, budget_s)),
        wait=wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.1),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )


def make_engine(url: str, *, statement_timeout_ms: int | None = None,
                lock_timeout_ms: int | None = None, pool_timeout_s: float | None = None) -> Engine:
    """An engine with the settings each backend needs to be safe under concurrent workers.

    SQLite: the file's folder is created, WAL journal, a busy timeout, foreign keys on, and
    transactions begun by us (`BEGIN`, or `BEGIN IMMEDIATE` for connections carrying the
    `ks_write` execution option) so that a read-then-write never fails on a stale snapshot.
    PostgreSQL (psycopg 3): pre-ping, a short connect timeout and keepalives (pg_connect_args),
    so an unreachable server answers quickly instead of hanging a request; the timeouts bound
    what one statement, one lock wait and one wait for a pooled connection may take.
    """
    parsed = parse_database_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    defaults = pg_connect_args(statement_timeout_ms=statement_timeout_ms,
                               lock_timeout_ms=lock_timeout_ms)
    connect_args = {k: v for k, v in defaults.items() if k not in parsed.query}
    extra: dict[str, Any] = {} if pool_timeout_s is None else {"pool_timeout": pool_timeout_s}
    return create_engine(parsed, pool_pre_ping=True, connect_args=connect_args, **extra)


def _sqlite_engine(url: URL) -> Engine:
    memory = _is_memory(url)
    if not memory:
        Path(str(url.database)).expanduser().parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {}
    if memory:
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Stop pysqlite's own implicit BEGIN; the "begin" hook below emits ours.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys = ON")
        if not memory:
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get("ks_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn driver failures into the store's typed errors (unreachable -> StoreUnavailable,
    missing tables -> SchemaBehind)."""
    try:
        yield
    except exc.DBAPIError as e:
        if _missing_table(e):
            raise SchemaBehind(
                f"the database has none of kernelsearch's tables or an old schema; {UPGRADE_HINT}"
            ) from e
        if isinstance(e, (exc.OperationalError, exc.InterfaceError)) or e.connection_invalidated:
            raise StoreUnavailable(f"database unavailable: {_first_line(e.orig)}") from e
        raise
    except exc.TimeoutError as e:
        raise StoreUnavailable(f"database unavailable: connection pool exhausted ({e})") from e


def _missing_table(e: exc.DBAPIError) -> bool:
    msg = str(e.orig)
    if "no such table" in msg or "no such column" in msg:
        return True
    return getattr(e.orig, "sqlstate", None) in ("42P01", "42703")


def _first_line(err: BaseException | None) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def alembic_config(connection: Any | None = None, url: str | None = None) -> Config:
    """Alembic's Config for the migrations shipped inside the `db` package."""
    pkg = _package_dir()
    cfg = Config(str(pkg / "alembic.ini"))
    cfg.set_main_option("script_location", str(pkg / "migrations"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    if url is not None:
        cfg.attributes["url"] = url
    return cfg


def head_revision() -> str:
    """The newest migration this code ships."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    """The revision stamped in the database's `ks_alembic_version` table (None: not migrated)."""
    with translate_errors(), engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        heads = ctx.get_current_heads()
    return heads[0] if heads else None


def upgrade(url: str, revision: str = "head") -> None:
    """Run the project's migrations up to `revision` (Optuna's tables are left alone).

    On PostgreSQL an advisory lock makes concurrent upgrades (several replicas starting at once)
    wait for each other instead of racing on CREATE TABLE.
    """
    engine = make_engine(url)
    try:
        with translate_errors(), engine.connect() as conn:
            conn = conn.execution_options(ks_write=True)
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
                command.upgrade(alembic_config(connection=conn), revision)
    finally:
        engine.dispose()


def check_schema(engine: Engine) -> None:
    """Raise SchemaBehind unless the database is at this code's newest migration."""
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    if current is None:
        raise SchemaBehind(f"the database has no kernelsearch schema (expected {head}); {UPGRADE_HINT}")
    known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if current not in known:
        raise SchemaBehind(
            f"the database is at revision {current}, unknown to this code (newer?); "
            f"upgrade kernelsearch, or {UPGRADE_HINT} with the newer code"
        )
    raise SchemaBehind(f"the database is at revision {current}, behind {head}; {UPGRADE_HINT}")
