"""`kernelsearch bench`: eager, torch.compile, Triton and roofline per case, in one run."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console


def writable_file(path: Optional[Path], option: str) -> None:
    """Refuse, before any work, an output file that could not be written at the end."""
    if path is None:
        return
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a directory", param_hint=option)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise typer.BadParameter(f"{parent} is not an existing directory", param_hint=option)
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise typer.BadParameter(f"{path} is not writable", param_hint=option)


def _case_of(kdef: Any, text: str) -> Any:
    """A `--case` value as a Case: the suite's, or one numbered None for other axes."""
    from kernelsearch.kernels.spec import Case

    from .cli_tune import parse_case

    axes = parse_case(kdef, text)
    return kdef.suite_case_of(axes) or Case(number=None, axes=axes)  # type: ignore[arg-type]


def bench(
    kernel: Optional[str] = typer.Argument(None, help="kernel name; every kernel when omitted"),
    case: list[str] = typer.Option([], "--case", metavar="N|AXIS=VALUE[,AXIS=VALUE]",
                                   help="a suite case number or the case's axes, as for tune "
                                        "(repeatable); every suite case when omitted"),
    config: Optional[str] = typer.Option(None, "--config", help="JSON config for the Triton kernel"),
    default: bool = typer.Option(False, "--default", help="use the kernel's default config, not the store"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the full report as JSON"),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="write a PNG plot of latency per case"),
    table_out: Optional[Path] = typer.Option(None, "--table", help="also write the table to this file"),
    n: Optional[int] = typer.Option(None, "--n", min=1,
                                    help="timed calls per series, median reported (default: 30 "
                                         "on a GPU, 3 under the Triton interpreter)"),
    no_references: bool = typer.Option(False, "--no-references", help="skip eager and torch.compile"),
    compare_default: bool = typer.Option(False, "--compare-default",
                                         help="also time the kernel's default config in the same run"),
) -> None:
    """Time each case: eager reference, torch.compile, Triton (given or best config), roofline."""
    from kernelsearch.kernels import all_kernels, get_kernel, set_resolver
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernelsearch.kernels.bench import bench_cases, dump, format_table, plot
    from kernelsearch.kernels.device import is_interpreter
    from kernelsearch.kernels.errors import InvalidConfig
    from kernelsearch.kernels.measure import default_repeats

    err = Console(stderr=True)
    from kernelsearch.kernels.undeclared import UndeclaredKernel

    from .cli_db import load_user_kernels

    # An undeclared kernel (the database's) is told apart from a typo; bench cannot time one.
    if kernel:
        load_user_kernels(None)
    try:
        kernels = [get_kernel(kernel)] if kernel else [
            k for k in all_kernels().values() if not isinstance(k, UndeclaredKernel)]
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="KERNEL") from None
    if isinstance(kernels[0] if kernel else None, UndeclaredKernel):
        raise typer.BadParameter(f"{kernel} is an undeclared kernel: bench draws a declaration's "
                                 f"inputs and references, which it has none of; its records hold "
                                 f"every config's time (`kernelsearch records list --kernel "
                                 f"{kernel} --json`, its dashboard page)", param_hint="KERNEL")
    cfg = None
    if config is not None:
        try:
            cfg = json.loads(config)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--config") from None
        if len(kernels) != 1:
            raise typer.BadParameter("--config needs a KERNEL", param_hint="--config")
        try:
            kernels[0].validate_config(cfg)
        except InvalidConfig as exc:
            raise typer.BadParameter(str(exc), param_hint="--config") from None
    for path, option in ((json_out, "--json"), (plot_out, "--plot"), (table_out, "--table")):
        writable_file(path, option)
    if plot_out is not None:
        try:
            import matplotlib  # noqa: F401  (the plot is drawn after the whole bench)
        except ImportError:
            raise typer.BadParameter("needs matplotlib (pip install matplotlib)",
                                     param_hint="--plot") from None
    n = n if n is not None else default_repeats()
    if default or cfg is not None:
        set_resolver(None)
    else:
        from kernelsearch.provider import install_default_provider
        from .settings import get_settings

        install_default_provider(get_settings())
    try:
        chosen_of = {k.name: [_case_of(k, c) for c in case] if case else list(k.cases)
                     for k in kernels}
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--case") from None
    total = sum(len(v) for v in chosen_of.values())
    if not case and is_interpreter():
        err.print(f"warning: {total} cases of {len(kernels)} kernel(s) under the Triton interpreter "
                  "on the CPU: this runs for hours. Time a few with --case N (see `kernelsearch "
                  "kernels KERNEL`).", markup=False, highlight=False, soft_wrap=True)
    reports = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=err, redirect_stdout=False) as bar:
        task = bar.add_task("bench", total=total)
        done = 0
        for k in kernels:
            chosen = chosen_of[k.name]
            started = -1

            def progress(msg: str, _base: int = done) -> None:
                # Called as each case starts: the ones before it are done.
                nonlocal started
                started += 1
                bar.update(task, completed=_base + started, description=msg)

            rep = bench_cases(k, [c.axes for c in chosen], config=cfg, n=n,
                              references=not no_references, numbers=[c.number for c in chosen],
                              compare_default=compare_default, progress=progress)
            done += len(chosen)
            bar.update(task, completed=done)
            reports.append(rep)
            table = format_table(rep)
            bar.stop()  # the table goes to stdout, below the bar (which is on stderr)
            print(table)
            sys.stdout.flush()
            bar.start()
            if table_out:
                with open(table_out, "a") as fh:
                    fh.write(table + "\n")
    if json_out:
        dump(reports, str(json_out))
    if plot_out:
        plot(reports, str(plot_out))


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
