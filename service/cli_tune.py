"""`kernelsearch tune`: tune suite or custom cases of one kernel, one Optuna study per case.

Cases come from the kernel's declaration only (`--case N` for a suite case, `--case axis=value`
for any other), so a plugin kernel is tuned exactly as a built-in one. `--trials N` adds N
evaluated configs to each case's study: earlier runs' trials (failed ones too) are kept, never
re-run, and do not use up this run's budget; `--fresh` drops them first, so every config is
measured again (a fixed kernel, a fixed check, or a wrong record withdrawn).
"""
from __future__ import annotations

import contextlib
import json
import logging
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

from .cli_format import format_latency

SAMPLER_HELP = "tpe (default), random, grid (exhaustive), gp, cmaes"
CASE_HELP = ("a suite case number (4), or the case's axes as AXIS=VALUE, several joined by "
             "commas (seq_len=1024; total_patches=5000,num_images=2); repeatable")
# Exit status of a tune that left some case without any record.
EXIT_NO_RECORD = 1


def parse_case(kdef: Any, text: str) -> dict[str, Any]:
    """One `--case` value as the kernel's validated axes; raises ValueError saying what is wrong.
    Values go through `KernelDef.validate_axes` as written, so the kernel decides their type."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return dict(kdef.case(int(text)).axes)
    axes: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"{text!r}: expected a suite case number or AXIS=VALUE[,AXIS=VALUE...]; "
                             f"{kdef.name}'s axes: {', '.join(a.name for a in kdef.axes)}")
        if name in axes:
            raise ValueError(f"{text!r}: axis {name!r} given twice")
        axes[name] = value
    return kdef.validate_axes(axes)


def _cases(kernel: str, case: list[str], all_: bool) -> list[dict[str, Any]]:
    from kernelsearch.kernels import get_kernel

    try:
        kdef = get_kernel(kernel)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="KERNEL") from None
    out: list[dict[str, Any]] = []
    if all_:
        out.extend(dict(c.axes) for c in kdef.cases)
    for text in case:
        try:
            out.append(parse_case(kdef, text))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--case") from None
    if not out:
        example = ",".join(f"{a.name}={a.minimum}" for a in kdef.axes)
        suite = f"1..{len(kdef.cases)}, " if kdef.cases else ""
        raise typer.BadParameter(f"give --case N (a suite case: {suite}see `kernelsearch kernels "
                                 f"{kernel}`), --case {example} or --all", param_hint="--case")
    seen, unique = set(), []
    for ax in out:
        key = json.dumps(ax, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            unique.append(ax)
    return unique


def _stored_calls(kernel: str, case: list[str], url: str | None,
                  unread: str | None) -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
    """For an undeclared kernel (None for any other): the (case, captured call) pairs to tune,
    those stored with its earlier jobs, every one or those `--case` names. It has no inputs of
    its own, so a case with no stored call exits 2 saying how to get one."""
    from kernelsearch.db.checks import axes_key
    from kernelsearch.db.errors import StoreError
    from kernelsearch.db.store import Store
    from kernelsearch.kernels import get_kernel
    from kernelsearch.kernels.undeclared import UndeclaredKernel

    from .settings import get_settings

    try:
        kdef = get_kernel(kernel)
    except KeyError as exc:
        also = f" (the database's undeclared kernels could not be read: {unread})" if unread else ""
        raise typer.BadParameter(f"{exc.args[0]}{also}", param_hint="KERNEL") from None
    if not isinstance(kdef, UndeclaredKernel):
        return None
    from .cli_remote import service_url

    if service_url(url) is not None:
        typer.echo(f"error: {kernel} is an undeclared kernel, tuned on its stored calls, which "
                   f"only its database holds: give --url DATABASE, or queue a job (POST /v1/jobs)",
                   err=True)
        raise typer.Exit(2)
    try:
        with Store(url or get_settings().database_url) as store:
            stored = store.kernel_captures(kernel)
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    from kernelsearch.search_space.job_acceptance import CALLS_STORED_BY

    how = f"an undeclared kernel is tuned on a call of it: {CALLS_STORED_BY}"
    if not stored:
        typer.echo(f"error: {kernel}: no call of it is stored to tune on; {how}", err=True)
        raise typer.Exit(2)
    if not case:
        return stored
    by_key = {axes_key(axes): (axes, cap) for axes, cap in stored}
    out = []
    for text in case:
        try:
            axes = parse_case(kdef, text)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--case") from None
        got = by_key.get(axes_key(axes))
        if got is None:
            have = "; ".join(_label(a) for a, _ in stored)
            typer.echo(f"error: {kernel} {_label(axes)}: no call of this case is stored to tune "
                       f"on ({how}); cases with one: {have}", err=True)
            raise typer.Exit(2)
        out.append(got)
    return out


def _use_call(kernel: str, call: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Register the kernel to tune on one stored call (the user's module imported here); exit 2
    saying why when it cannot be."""
    from kernelsearch.kernels import get_kernel, registry
    from kernelsearch.kernels.capture import (Capture, CaptureError, KernelModuleUnavailable,
                                              captured_kernel)

    defn = get_kernel(kernel).definition  # type: ignore[attr-defined]
    try:
        registry.register(captured_kernel(defn, Capture.from_json(call[1])), replace=True)
    except KernelModuleUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except CaptureError as exc:
        typer.echo(f"error: {kernel} {_label(call[0])}: the stored call does not fit the kernel's "
                   f"definition now: {exc}", err=True)
        raise typer.Exit(2) from None


@contextlib.contextmanager
def logs_through(console: Any) -> Iterator[None]:
    """While a progress bar is live: Optuna's INFO lines (one per trial) are silenced, and its,
    kernelsearch's and Python's warnings are printed through the bar's console, above the bar."""
    import optuna
    from rich.logging import RichHandler

    handler = RichHandler(console=console, level=logging.WARNING, show_path=False,
                          show_time=False)
    loggers = [logging.getLogger(n) for n in ("optuna", "kernelsearch", "py.warnings")]
    levels = [lg.level for lg in loggers]
    optuna.logging.disable_default_handler()
    logging.captureWarnings(True)
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)
        logging.captureWarnings(False)
        optuna.logging.enable_default_handler()


def _label(axes: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in axes.items())


def summary_lines(r: Any) -> list[str]:
    """What one case's run did, in plain lines that wrap rather than truncate."""
    new_failed = sum(r.failures.new_kinds.values())
    kinds = "".join(f", {k} {v}" for k, v in sorted(r.failures.new_kinds.items()))
    best = format_latency(r.best.latency_us)
    record = "improved" if r.best.improved else ("kept" if r.best.config else "none")
    lines = [f"case {_label(r.key.axes)}: best {best}, record {record}, stopped by {r.stopped_because}",
             f"  new trials: {r.trials.n_run_now} ({r.trials.n_run_now - new_failed} ok, {new_failed} failed{kinds}); "
             f"the study holds {r.trials.n_complete + r.trials.n_failed} ({r.trials.n_failed} failed)",
             f"  time: compile {r.times.compile_s:.1f} s, check {r.times.check_s:.1f} s, "
             f"measure {r.times.measure_s:.1f} s"]
    if r.best.config:
        lines.append(f"  best config: {json.dumps(r.best.config, sort_keys=True)}")
    if r.best.latency_us is None:
        lines.append(f"  no record: {r.failure_summary()}")
    return lines


def tune(
    kernel: str = typer.Argument(..., help="kernel name (see `kernelsearch kernels`)"),
    case: list[str] = typer.Option([], "--case", metavar="N|AXIS=VALUE[,AXIS=VALUE]",
                                   help=CASE_HELP),
    all_: bool = typer.Option(False, "--all", help="every suite case of the kernel"),
    trials: int = typer.Option(50, "--trials", min=1,
                               help="configs to evaluate now per case, added to the case's study "
                                    "(earlier trials are kept and never re-run)"),
    sampler: str = typer.Option("tpe", "--sampler", help=SAMPLER_HELP),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.001,
                                            help="time budget per case, seconds"),
    patience: Optional[int] = typer.Option(None, "--patience", min=1,
                                           help="stop a case after this many trials without improvement"),
    no_warm_start: bool = typer.Option(False, "--no-warm-start",
                                       help="do not enqueue the best configs of neighbouring cases"),
    url: Optional[str] = typer.Option(None, "--url", help="database URL (default: KS_DATABASE_URL)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON here"),
    measure_n: Optional[int] = typer.Option(None, "--measure-n", min=1,
                                            help="timed calls per trial (default: 30 on a GPU, "
                                                 "3 under the Triton interpreter)"),
    trial_timeout: Optional[float] = typer.Option(None, "--trial-timeout", min=0.001,
                                                  help="kill a candidate after this many seconds "
                                                       "(default: 120 on a GPU, 600 under the "
                                                       "interpreter)"),
    compile_workers: Optional[int] = typer.Option(None, "--compile-workers", min=0,
                                                  help="compile-ahead processes on a GPU (0: off)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="sampler seed"),
    fresh: bool = typer.Option(False, "--fresh",
                               help="start each case's study anew: its earlier trials, failed "
                                    "ones included, are dropped and every config is measured again"),
) -> None:
    """Tune cases of KERNEL; each case's best config becomes (or improves) its record. Exits 1
    when a case ends without any record, saying why its trials failed."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store
    from kernelsearch.search_space.runner import TrialRunner
    from kernelsearch.search_space.space import SpaceError, case_space
    from kernelsearch.search_space.tuner import (SAMPLERS, TuneHooks, TuneOptions, study_name,
                                                 tune_case)

    from .settings import get_settings

    if sampler not in SAMPLERS:
        raise typer.BadParameter(f"expected one of {', '.join(SAMPLERS)}", param_hint="--sampler")
    from .cli_db import load_user_kernels

    unread = load_user_kernels(url)
    # An undeclared kernel is tuned on the calls stored with its earlier jobs: one per case.
    calls = _stored_calls(kernel, case, url, unread)
    cases = [a for a, _ in calls] if calls is not None else _cases(kernel, case, all_)
    if calls is not None:
        _use_call(kernel, calls[0])
    try:
        case_space(kernel, cases[0])
    except SpaceError as exc:  # a space file that is missing or does not fit the kernel
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out is not None and json_out.is_dir():
        raise typer.BadParameter(f"{json_out} is a directory", param_hint="--json")
    settings = get_settings()
    from .cli_remote import service_url

    base = service_url(url)
    # Through the service: tuned here in a scratch store, whose records are then uploaded.
    db_url = _scratch_url() if base is not None else (url or settings.database_url)
    console = Console()
    upgrade(db_url)
    store = Store(db_url)
    results = []
    # This run's own budget: its trials carry the tag, so `trials` are added to each study.
    run_tag = f"cli:{uuid.uuid4().hex[:12]}"
    runner = TrialRunner(trial_timeout_s=trial_timeout or settings.trial_timeout_s,
                         compile_workers=compile_workers)
    try:
        runner.start()
        console.print(f"[bold]{kernel}[/]: {len(cases)} case(s) on [cyan]{runner.device_name}[/], "
                      f"sampler {sampler}, {trials} new trials per case, a trial's limit "
                      f"{runner.trial_timeout_s:g} s")
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("best {task.fields[best]}"), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress, logs_through(console):
            for axes in cases:
                task = progress.add_task(_label(axes), total=trials, best="-")

                def report(done: int, total: int, best: float | None, task=task) -> None:
                    progress.update(task, completed=done, best=format_latency(best))

                if calls is not None:
                    _use_call(kernel, calls[cases.index(axes)])
                if fresh:
                    store.reset_study(study_name(kernel, axes, runner.device_name))
                res = tune_case(kernel, axes, store=store, storage=db_url, runner=runner,
                                options=TuneOptions(n_trials=trials, sampler=sampler, timeout_s=timeout,
                                                    patience=patience, warm_start=not no_warm_start,
                                                    seed=seed, measure_n=measure_n or settings.measure_n,
                                                    run_tag=run_tag), hooks=TuneHooks(progress=report))
                progress.update(task, completed=res.trials.n_counted)
                results.append(res)
        if base is not None:
            _share(base, store, kernel, console)
    finally:
        runner.close()
        store.close()
    console.print(f"{kernel} on {results[0].key.device if results else '?'}:")
    for r in results:
        for line in summary_lines(r):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([r.as_dict() for r in results], indent=1, default=str))
        console.print(f"results written to {json_out}")
    empty = [r for r in results if r.best.latency_us is None]
    if empty:
        for r in empty:
            typer.echo(f"error: {kernel} {_label(r.key.axes)}: no record: {r.failure_summary()}",
                       err=True)
        raise typer.Exit(EXIT_NO_RECORD)


def _scratch_url() -> str:
    """A new SQLite store of this run's own, for a tune whose records go to the service."""
    import tempfile

    return f"sqlite:///{tempfile.mkdtemp(prefix='kernelsearch-tune-')}/tune.db"


def _share(base: str, store: Any, kernel: str, console: Any) -> None:
    """Upload the records this run stored (POST /v1/records, KS_API_TOKEN): the service gates
    them as any upload, and a worker's record of the same key is never replaced by one."""
    from kernelsearch.rest_client import ClientError

    from .cli_remote import client, fail

    records = store.export_records(kernel=kernel)["records"]
    try:
        with client(base) as c:
            for rec in records:
                c.upload_record(rec)
    except ClientError as exc:
        raise fail(exc) from None
    console.print(f"shared {len(records)} record(s) with the service at {base}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("tune")(tune)
