"""`kernelsearch` command line: each area registers its commands from its own module."""
from __future__ import annotations

import os
import signal
from typing import Any

import typer

app = typer.Typer(
    help="kernelsearch: tune Triton kernels per workload case, keep the best configs, serve them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help: Typer's rich panels print a type after every flag (`--json <bool>`),
    # as if it took a value.
    rich_markup_mode=None,
)


@app.callback()
def _global_options(
    kernel_module: list[str] = typer.Option(
        [], "--kernel-module", metavar="MODULE",
        help="import a module that declares kernels (repeatable; as KS_KERNEL_MODULES)"),
    service: str = typer.Option(
        None, "--service", metavar="URL",
        help="the service's address: `kernels`, `records list|export` and `search` speak to its "
             "REST API (as KS_SERVICE_URL when KS_DATABASE_URL is unset)"),
) -> None:
    """Options every command takes: the user's kernel modules are loaded before it runs."""
    if service:
        os.environ["KS_SERVICE_URL"] = service
        os.environ.pop("KS_DATABASE_URL", None)
    if not kernel_module:
        return
    from kernelsearch.kernels.registry import MODULES_ENV, PluginLoadError, load_module

    # Also for the processes this one starts (trial children, an embedded worker).
    os.environ[MODULES_ENV] = ",".join([*filter(None, os.environ.get(MODULES_ENV, "").split(",")),
                                        *kernel_module])
    for m in kernel_module:
        try:
            load_module(m)
        except PluginLoadError as exc:
            raise typer.BadParameter(str(exc), param_hint="--kernel-module") from None


@app.command("kernels")
def kernels_cmd(
    name: str = typer.Argument(None, help="a kernel: show its declaration"),
    as_json: bool = typer.Option(False, "--json", help="JSON for scripts"),
    url: str = typer.Option(None, "--url", help="database (or the service's http(s) address) "
                                                "whose undeclared kernels are listed too "
                                                "(default: KS_DATABASE_URL, else KS_SERVICE_URL)"),
) -> None:
    """List the kernels, or one kernel's declaration: case axes, tunable parameters, suite
    cases and default config (what `tune --case` and `bench` accept). The undeclared kernels
    (`@kernelsearch.autotune` with no declaration) the database knows are listed with them."""
    import json

    from kernelsearch.kernels import all_kernels, get_kernel
    from kernelsearch.kernels.undeclared import UndeclaredKernel

    from .cli_db import load_user_kernels

    unread = load_user_kernels(url)
    if name is None:
        if as_json:
            print(json.dumps([k.describe() for k in all_kernels().values()], indent=1))
            return
        for k in all_kernels().values():
            print(f"{k.name}\t{k.benchmark_problem}\t{','.join(a.name for a in k.axes)}\t{k.description}")
        return
    try:
        k = get_kernel(name)
    except KeyError as exc:
        also = f" (the database's undeclared kernels could not be read: {unread})" if unread else ""
        raise typer.BadParameter(f"{exc.args[0]}{also}", param_hint="NAME") from None
    if isinstance(k, UndeclaredKernel):
        _show_undeclared(k, as_json)
        return
    listed = _listed_configs(k)
    if as_json:
        d = k.describe()
        d["cases"] = [{"case": c.number, **c.axes} for c in k.cases]
        if listed is not None:
            d["configs"] = listed
        print(json.dumps(d, indent=1))
        return
    print(f"kernel: {k.name}\ndescription: {k.description}\nproblem: {k.benchmark_problem}")
    for a in k.axes:
        values = f"one of {', '.join(a.choices)}" if a.categorical else f"{a.minimum}..{a.maximum}"
        print(f"axis: {a.name}\t{values}\t{a.doc}")
    if k.extra_axes:
        print(f"informational axes (accepted, not part of the key): {', '.join(k.extra_axes)}")
    print(f"default config: {json.dumps(k.default_config, sort_keys=True)}")
    for p in k.params:
        cond = f" (when {', '.join(f'{a} in {list(v)}' for a, v in p.requires.items())})" if p.requires else ""
        # A listed space's parameters are not independent choices: the configs below are.
        choices = "" if listed is not None else f"\tchoices={list(p.choices)}"
        print(f"param: {p.name}\tdefault={p.default!r}{choices}{cond}\t{p.doc}")
    if listed is not None:
        print(f"search space: these {len(listed)} configs (no other combination)")
        for cfg in listed:
            print(f"config: {json.dumps(cfg, sort_keys=True)}")
    for c in k.cases:
        print(f"case: {c.number}\t" + "\t".join(f"{a}={v}" for a, v in c.axes.items()))


def _show_undeclared(k: Any, as_json: bool) -> None:
    """An undeclared kernel as its decorator defined it: where it lives, its source identity,
    its key (Triton's `key` arguments, then its tensors' dtypes) and its configs; it has no
    suite, bytes moved or float64 reference."""
    import json

    d = k.definition
    configs = [dict(c) for c in (*d.configs, *d.search_space)]
    if as_json:
        print(json.dumps({**k.describe(), "undeclared": d.as_json(), "configs": configs}, indent=1))
        return
    print(f"kernel: {k.name}\nundeclared: {d.module}.{d.qualname} (@kernelsearch.autotune, no "
          f"declaration)\nsource: {d.source_hash}")
    for a in k.axes:
        values = "a dtype" if a.categorical else "an integer"
        print(f"key: {a.name}\t{values}\t{a.doc}")
    print(f"configs: {len(d.configs)} listed" + (f", {len(d.search_space)} more workers may search"
                                                 if d.search_space else ""))
    for cfg in configs:
        print(f"config: {json.dumps(cfg, sort_keys=True)}")


def _listed_configs(k: Any) -> list[dict[str, Any]] | None:
    """The configs of a kernel whose space is a list (a decorator's, `space=[...]`), else None."""
    if k.space is None or isinstance(k.space, (str, os.PathLike)):
        return None
    from kernelsearch.search_space.space import ListedSpace, SpaceError, load_space

    try:
        space = load_space(k.name)
    except SpaceError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME") from None
    return space.grid() if isinstance(space, ListedSpace) else None


def _register() -> None:
    from . import cli_bench, cli_db, cli_optuna, cli_search, cli_serve, cli_tune

    for mod in (cli_db, cli_tune, cli_bench, cli_serve, cli_optuna, cli_search):
        mod.register(app)


_register()


def _interrupted(signum: int, frame: object) -> None:
    raise SystemExit(130)


def main() -> None:
    """The `kernelsearch` command. Ctrl-C ends any command quietly with status 130 (the shell's
    status for SIGINT), its `finally` blocks run, and no traceback is printed; `serve` and
    `worker` install their own graceful handlers while they run."""
    signal.signal(signal.SIGINT, _interrupted)
    app()


if __name__ == "__main__":
    main()
