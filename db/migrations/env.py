"""Alembic environment limited to kernelsearch's own tables.

Optuna keeps its 13 tables (one named `alembic_version`) in the same database, so this
environment uses its own version table and never looks at tables outside `Base.metadata`
(otherwise autogenerate would propose dropping Optuna's tables).
"""
from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection

from kernelsearch.db.engine import VERSION_TABLE, make_engine
from kernelsearch.db.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "table":
        return name in target_metadata.tables
    return True


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Write the UTC type as a plain timezone-aware DateTime, so migrations never import db."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _options(dialect_name: str) -> dict[str, Any]:
    return {
        "target_metadata": target_metadata,
        "version_table": VERSION_TABLE,
        "include_name": include_name,
        "render_as_batch": dialect_name == "sqlite",
        "compare_type": True,
        "render_item": render_item,
    }


def _url() -> str:
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database URL: pass -x url=... (or use `kernelsearch db upgrade`)")
    return url


def run_offline() -> None:
    url = _url()
    context.configure(url=url, literal_binds=True, **_options(url.split(":", 1)[0].split("+")[0]))
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    context.configure(connection=connection, **_options(connection.dialect.name))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn.execution_options(ks_write=True))
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
