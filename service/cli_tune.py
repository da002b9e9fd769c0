"""`kernelsearch tune`: tune suite or custom cases of one kernel, one Optuna study per case."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

SAMPLER_HELP = "tpe (default), random, grid (exhaustive), gp, cmaes"


def _cases(kernel: str, case: list[int], all_: bool, seq_len: list[int],
           total_patches: list[int]) -> list[dict[str, int]]:
    from kernelsearch.kernels import get_kernel

    try:
        kdef = get_kernel(kernel)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="KERNEL") from None
    axis_names = {a.name for a in kdef.axes}
    out: list[dict[str, int]] = []
    if all_:
        out.extend(dict(c.axes) for c in kdef.cases)
    for n in case:
        try:
            out.append(dict(kdef.case(n).axes))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--case") from None
    for opt, axis, values in (("--seq-len", "seq_len", seq_len),
                              ("--total-patches", "total_patches", total_patches)):
        if values and axis not in axis_names:
            raise typer.BadParameter(f"{kernel} has no axis {axis}; its axes: "
                                     f"{', '.join(sorted(axis_names))}", param_hint=opt)
        for v in values:
            try:
                out.append(kdef.validate_axes({axis: v}))
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint=opt) from None
    if not out:
        raise typer.BadParameter("give --case N, --all, --seq-len or --total-patches",
                                 param_hint="cases")
    seen, unique = set(), []
    for ax in out:
        key = tuple(sorted(ax.items()))
        if key not in seen:
            seen.add(key)
            unique.append(ax)
    return unique


def tune(
    kernel: str = typer.Argument(..., help="kernel name (see `kernelsearch kernels`)"),
    case: list[int] = typer.Option([], "--case", help="suite case number (repeatable)"),
    all_: bool = typer.Option(False, "--all", help="every suite case of the kernel"),
    seq_len: list[int] = typer.Option([], "--seq-len", help="custom seq_len (repeatable)"),
    total_patches: list[int] = typer.Option([], "--total-patches",
                                            help="custom total_patches (repeatable)"),
    trials: int = typer.Option(50, "--trials", min=1, help="configs to evaluate per case"),
    sampler: str = typer.Option("tpe", "--sampler", help=SAMPLER_HELP),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.001,
                                            help="time budget per case, seconds"),
    patience: Optional[int] = typer.Option(None, "--patience", min=1,
                                           help="stop a case after this many trials without improvement"),
    no_warm_start: bool = typer.Option(False, "--no-warm-start",
                                       help="do not enqueue the best configs of neighbouring cases"),
    url: Optional[str] = typer.Option(None, "--url", help="database URL (default: KS_DATABASE_URL)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON here"),
    measure_n: int = typer.Option(30, "--measure-n", min=1, help="timed calls per trial"),
    trial_timeout: Optional[float] = typer.Option(None, "--trial-timeout", min=0.001,
                                                  help="kill a candidate after this many seconds"),
    compile_workers: Optional[int] = typer.Option(None, "--compile-workers", min=0,
                                                  help="compile-ahead processes on a GPU (0: off)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="sampler seed"),
) -> None:
    """Tune cases of KERNEL; each case's best config becomes (or improves) its record."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store
    from kernelsearch.search_space.runner import TrialRunner
    from kernelsearch.search_space.tuner import SAMPLERS, tune_case

    from .settings import get_settings

    if sampler not in SAMPLERS:
        raise typer.BadParameter(f"expected one of {', '.join(SAMPLERS)}", param_hint="--sampler")
    cases = _cases(kernel, case, all_, seq_len, total_patches)
    settings = get_settings()
    db_url = url or settings.database_url
    console = Console()
    upgrade(db_url)
    store = Store(db_url)
    results = []
    runner = TrialRunner(trial_timeout_s=trial_timeout or settings.trial_timeout_s,
                         compile_workers=compile_workers)
    try:
        runner.start()
        console.print(f"[bold]{kernel}[/]: {len(cases)} case(s) on [cyan]{runner.device_name}[/], "
                      f"sampler {sampler}, {trials} trials per case")
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("best {task.fields[best]}"), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            for axes in cases:
                label = ",".join(f"{k}={v}" for k, v in axes.items())
                task = progress.add_task(label, total=trials, best="-")

                def report(done: int, total: int, best: float | None, task=task) -> None:
                    progress.update(task, completed=done,
                                    best=f"{best:.2f} us" if best is not None else "-")

                res = tune_case(kernel, axes, store=store, storage_url=db_url, n_trials=trials,
                                sampler=sampler, timeout_s=timeout, patience=patience,
                                warm_start=not no_warm_start, runner=runner, seed=seed,
                                progress=report, measure_n=measure_n)
                progress.update(task, completed=res.n_complete + res.n_failed)
                results.append(res)
    finally:
        runner.close()
        store.close()
    table = Table(title=f"{kernel} on {results[0].device if results else '?'}")
    for col in ("case", "best us", "trials ok/failed", "stopped", "record", "compile s",
                "check s", "measure s", "best config"):
        table.add_column(col)
    for r in results:
        table.add_row(
            ",".join(f"{k}={v}" for k, v in r.axes.items()),
            f"{r.best_latency_us:.2f}" if r.best_latency_us is not None else "-",
            f"{r.n_complete}/{r.n_failed}", r.stopped_because,
            "improved" if r.improved else ("kept" if r.record_id or r.best_config else "none"),
            f"{r.compile_s:.1f}", f"{r.check_s:.1f}", f"{r.measure_s:.1f}",
            json.dumps(r.best_config, sort_keys=True) if r.best_config else "-")
    console.print(table)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([r.as_dict() for r in results], indent=1, default=str))
        console.print(f"results written to {json_out}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the main app."""
    app.command("tune")(tune)
