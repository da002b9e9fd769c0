"""`kernelsearch db ...` and `kernelsearch records ...`: migrations and the records file format.

Output is plain text, one fact per line, so scripts can grep it; errors go to stderr with exit 1.
"""
from __future__ import annotations

import json
import sys
from datetime import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from kernelsearch.db.engine import check_schema, current_revision, head_revision, make_engine, upgrade
from kernelsearch.db.errors import NotFound, SchemaBehind, StoreError
from kernelsearch.db.store import Store
from kernelsearch.rest_client import ClientError

from .cli_format import format_latency
from .cli_remote import client as remote_client
from .cli_remote import fail as remote_fail
from .cli_remote import service_url
from .views import unknown_selection

db_app = typer.Typer(help="Database schema: Alembic migrations of kernelsearch's own tables.", no_args_is_help=True)
records_app = typer.Typer(help="Tuned records: list, export to and import from JSON files, withdraw.",
                          no_args_is_help=True)

UrlOpt = Annotated[
    str | None, typer.Option("--url", help="database URL (default: KS_DATABASE_URL, else kernelsearch.db in the user data directory)")
]
KernelOpt = Annotated[str | None, typer.Option("--kernel", help="only this kernel")]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="only this device name")]
HistoryOpt = Annotated[bool, typer.Option("--history", help="include superseded records")]


def _url(url: str | None) -> str:
    if url:
        return url
    from .settings import get_settings

    return get_settings().database_url


def _shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def missing_file(url: str) -> str | None:
    """Why a SQLite URL names no existing file (opening it would create an empty database; only
    `db upgrade` creates one), or None."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None  # make_engine says what is wrong with it
    db = parsed.database
    if parsed.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:"):
        return None
    path = Path(db).expanduser()
    if not path.exists():
        return (f"no database at {path}; run `kernelsearch db upgrade` to create it "
                f"(--url {_shown(url)})")
    return None


def _refusemissing_file(url: str) -> None:
    """A SQLite URL naming no existing file: exit 1 instead of creating an empty database."""
    why = missing_file(url)
    if why is not None:
        raise _fail(why)


def load_user_kernels(url: str | None) -> str | None:
    """Register the undeclared kernels the database keeps (what `@kernelsearch.autotune`
    registered with the service), so that `kernels`, `tune` and `records` know them as the
    service does. Returns why none could be read (no database, unreachable, schema behind), or
    None; never exits: a command that needs no database still runs."""
    from .definitions import load_definitions

    base = service_url(url)
    if base is not None:
        return _load_service_kernels(base)
    target = _url(url)
    why = missing_file(target)
    if why is not None:
        return why
    try:
        with Store(target) as store:
            check_schema(store.engine)
            load_definitions(store)
    except (StoreError, ValueError) as e:
        return str(e)
    return None


def _load_service_kernels(base: str) -> str | None:
    """`load_user_kernels` through the service: its kept definitions registered here."""
    from .definitions import register_definition

    try:
        with remote_client(base) as c:
            docs = c.definitions()
    except ClientError as e:
        return e.message
    for name, doc in docs.items():
        try:
            register_definition(doc)
        except ValueError as e:
            return f"the service's definition of {name} not registered: {e}"
    return None


@contextmanager
def _store(url: str | None) -> Iterator[Store]:
    """An upgraded store, or a clear error (schema behind, unreachable) and exit 1.

    Covers the body of the `with` too: a StoreError raised there exits the same way.
    """
    _refusemissing_file(_url(url))
    try:
        with Store(_url(url)) as store:
            check_schema(store.engine)
            yield store
    except (StoreError, ValueError) as e:
        raise _fail(str(e)) from None


@db_app.command("upgrade")
def db_upgrade(
    url: UrlOpt = None,
    revision: Annotated[str, typer.Option("--revision", help="target revision")] = "head",
) -> None:
    """Create or migrate kernelsearch's tables (Optuna's tables in the same database are left alone)."""
    target = _url(url)
    try:
        upgrade(target, revision)
        engine = make_engine(target)
        try:
            rev = current_revision(engine)
        finally:
            engine.dispose()
    except (StoreError, ValueError) as e:
        raise _fail(str(e)) from None
    typer.echo(f"database: {_shown(target)}")
    typer.echo(f"revision: {rev}")


@db_app.command("current")
def db_current(
    url: UrlOpt = None,
    check: Annotated[bool, typer.Option("--check", help="exit 1 when the database is not at head")] = False,
) -> None:
    """Show the database's migration revision and the code's head."""
    target = _url(url)
    _refusemissing_file(target)
    try:
        engine = make_engine(target)
        try:
            rev = current_revision(engine)
            try:
                check_schema(engine)
                state = "up to date"
            except SchemaBehind as e:
                state = f"behind: {e}"
        finally:
            engine.dispose()
    except (StoreError, ValueError) as e:
        raise _fail(str(e)) from None
    typer.echo(f"database: {_shown(target)}")
    typer.echo(f"current: {rev or 'none'}")
    typer.echo(f"head: {head_revision()}")
    typer.echo(f"status: {state}")
    if check and state != "up to date":
        raise typer.Exit(1)


@records_app.command("export")
def records_export(
    file: Annotated[str, typer.Argument(help="output JSON file, or - for stdout")],
    kernel: KernelOpt = None,
    device: DeviceOpt = None,
    history: HistoryOpt = False,
    url: UrlOpt = None,
) -> None:
    """Write records as a versioned JSON document (schema kernelsearch.records); from the
    service's REST API with --url http://... or KS_SERVICE_URL alone."""
    base = service_url(url)
    if base is not None:
        try:
            with remote_client(base) as c:
                doc = c.export_records(kernel=kernel, device=device, history=history)
        except ClientError as e:
            raise remote_fail(e) from None
    else:
        with _store(url) as store:
            doc = store.export_records(kernel=kernel, device=device, include_history=history)
            unknown = unknown_selection(store, kernel, device) if not doc["records"] else None
        if unknown:
            raise _fail(unknown)
    text = json.dumps(doc, indent=2) + "\n"
    if file == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path = Path(file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    typer.echo(f"exported: {len(doc['records'])} records to {file}", err=True)
    if not doc["records"]:
        chosen = ", ".join(f"{n} {v!r}" for n, v in (("kernel", kernel), ("device", device)) if v)
        typer.echo(f"note: no {'' if history else 'current '}records "
                   f"{f'of {chosen} ' if chosen else ''}in the database; the file lists none",
                   err=True)


def _read_doc(file: str) -> Any:
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as e:
        raise _fail(f"cannot read {file}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, or a 5000-digit number
        raise _fail(f"{file} is not valid JSON: {e}") from None


@records_app.command("import")
def records_import(
    file: Annotated[str, typer.Argument(help="JSON file written by `records export`, or - for stdin")],
    if_empty: Annotated[
        bool, typer.Option("--if-empty", help="do nothing when the database already has records")
    ] = False,
    all_or_nothing: Annotated[
        bool, typer.Option("--all-or-nothing",
                           help="import nothing when any entry cannot be imported")
    ] = False,
    url: UrlOpt = None,
) -> None:
    """Restore records (a backup made by `records export`): every entry passes the acceptance
    gate (not what its kernel declares, or not a measurement: refused), the kernel definitions
    the file carries are added where this database lacks them, and the same file twice changes
    nothing. An entry that cannot be imported is listed by index and kernel while the others go
    in, and the exit status is 1; --all-or-nothing imports nothing when any entry is bad. An
    entry that does not say its origin is an import."""
    from kernelsearch.db.wire import doc_definitions

    from .definitions import restore_definitions

    with _store(url) as store:
        try:
            if if_empty and store.has_records():
                typer.echo("skipped: the database already has records (--if-empty)")
                return
            from kernelsearch.search_space.acceptance import import_check

            doc = _read_doc(file)
            new_defs, problems = restore_definitions(store, doc_definitions(doc))
            if problems and all_or_nothing:
                raise _fail(f"{file}: {problems[0]}")
            report = store.import_records(doc, check=import_check, keep_going=not all_or_nothing)
            kernels = doc_definitions(doc)
            for name in new_defs:
                store.save_definition(name, kernels[name])
        except StoreError as e:
            raise _fail(f"{file}: {e}") from None
    typer.echo(f"imported: {file}")
    typer.echo(f"added: {report.added}")
    typer.echo(f"superseded: {report.superseded}")
    typer.echo(f"unchanged: {report.unchanged}")
    typer.echo(f"trials added: {report.trials_added}")
    typer.echo(f"kernel definitions added: {len(new_defs)}")
    typer.echo(f"rejected: {len(report.rejected)}")
    for p in problems:
        typer.echo(f"error: {file}: {p}", err=True)
    for r in report.rejected:
        typer.echo(f"error: {file}: not imported (kernel {r.kernel!r}): {r.message}", err=True)
    if report.rejected or problems:
        raise typer.Exit(1)


def _fmt_axes(axes: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(axes.items()))


def _known_kernel_or_exit(store: Store, kernel: str) -> None:
    """A kernel neither declared here nor in the store is a typo: exit 1 naming the known ones."""
    from kernelsearch.kernels import kernel_names

    known = set(kernel_names()) | {r.kernel for r in store.list_records(include_history=True)}
    if kernel not in known:
        raise _fail(f"unknown kernel {kernel!r}; known: {', '.join(sorted(known)) or 'none'}")


@records_app.command("list")
def records_list(
    kernel: KernelOpt = None,
    device: DeviceOpt = None,
    history: HistoryOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON list instead of text lines")] = False,
    url: UrlOpt = None,
) -> None:
    """One line per record: kernel, device, axes, median latency, current/history, config,
    origin (worker, upload, import) and id (what `records delete` takes); --json for the raw
    numbers, latencies in us. From the service's REST API with --url http://... or
    KS_SERVICE_URL alone."""
    base = service_url(url)
    if base is not None:
        try:
            with remote_client(base) as c:
                rows = [_as_listed(d) for d in c.records(kernel=kernel, device=device,
                                                         history=history)]
        except ClientError as e:
            raise remote_fail(e) from None
    else:
        with _store(url) as store:
            recs = store.list_records(kernel=kernel, device=device, include_history=history)
            if kernel is not None and not recs:
                _known_kernel_or_exit(store, kernel)
        rows = [r.as_dict() for r in recs]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo("kernel\tdevice\taxes\tmedian\tstate\ttuned_at\tconfig\torigin\tid")
    for r in rows:
        state = "current" if r["is_current"] else "history"
        tuned = datetime.fromisoformat(r["tuned_at"]).isoformat(timespec="seconds")
        typer.echo(
            f"{r['kernel']}\t{r['device']}\t{_fmt_axes(r['axes'])}\t"
            f"{format_latency(r['latency_median_us'])}\t{state}\t{tuned}\t"
            f"{json.dumps(r['config'], sort_keys=True)}\t{r['origin']}\t{r['id']}"
        )


def _as_listed(d: dict[str, Any]) -> dict[str, Any]:
    """A record as the service answers it, in the form `records list` prints from a database:
    the record's own fields in their order, without the API's short forms (case, latency_us)."""
    from dataclasses import fields

    from kernelsearch.db.views import RecordView

    out = {f.name: d[f.name] for f in fields(RecordView) if f.name in d}
    for f in fields(RecordView):  # the API writes UTC as Z, the store's as_dict as +00:00
        if "datetime" in str(f.type) and isinstance(out.get(f.name), str):
            out[f.name] = datetime.fromisoformat(out[f.name]).isoformat()
    return out


def _parse_case(text: str) -> dict[str, Any]:
    """`--case` as a JSON object or `name=value,...` (integer values as ints)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            got = json.loads(text)
        except ValueError as e:
            raise _fail(f"--case: not a JSON object: {e}") from None
        if not isinstance(got, dict):
            raise _fail("--case: expected a JSON object")
        return got
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise _fail(f"--case: expected name=value,..., got {part!r}")
        v = value.strip()
        out[name.strip()] = int(v) if v.lstrip("+-").isdigit() else v
    if not out:
        raise _fail("--case: give the case's axes, e.g. total_patches=64")
    return out


@records_app.command("delete")
def records_delete(
    ids: Annotated[list[int] | None, typer.Argument(
        help="ids of the records to withdraw (`records list` shows them)", min=1, max=2**31 - 1,
        show_default=False)] = None,
    kernel: Annotated[str | None, typer.Option("--kernel", help="with --device and --case: withdraw "
                                                                "that case's current record")] = None,
    device: Annotated[str | None, typer.Option("--device", help="the device of --case")] = None,
    case: Annotated[str | None, typer.Option("--case", help="the case's axes: a JSON object or "
                                                            "name=value,...")] = None,
    url: UrlOpt = None,
) -> None:
    """Withdraw records (e.g. a bad upload): each is deleted, and where it was current the best
    record of its case's history is served in its place, or none. Exit 1 when a record does not
    exist (those before it are withdrawn)."""
    by_case = (kernel, device, case)
    if ids and any(v is not None for v in by_case):
        raise _fail("give record ids, or --kernel, --device and --case; not both")
    if not ids and not all(v is not None for v in by_case):
        raise _fail("give record ids, or all of --kernel, --device and --case")
    with _store(url) as store:
        targets = list(ids or [])
        if not targets:
            assert kernel is not None and device is not None and case is not None
            axes = _parse_case(case)
            current = [r for r in store.list_records(kernel=kernel, device=device)
                       if r.axes == axes]
            if not current:
                raise _fail(f"no current record of kernel {kernel!r} on {device!r} for case "
                            f"{json.dumps(axes, sort_keys=True)}")
            targets = [current[0].id]
        for rid in targets:
            try:
                got = store.withdraw_record(rid)
            except NotFound as e:
                raise _fail(str(e)) from None
            store.drop_orphan_artifact_blobs()  # its compiled kernels went with it
            w = got.withdrawn
            typer.echo(f"withdrawn: {w.id} {w.kernel} {w.device} {_fmt_axes(w.axes)} "
                       f"{w.latency_median_us:.3f} us ({w.origin})")
            now = got.now_current
            typer.echo(f"now current: {now.id} {now.latency_median_us:.3f} us ({now.origin})" if now
                       else "now current: none")


def register(app: typer.Typer) -> None:
    """Add `db` and `records` command groups to the main app."""
    app.add_typer(db_app, name="db")
    app.add_typer(records_app, name="records")
