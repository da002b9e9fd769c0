"""`kernelsearch` command line: each area registers its commands from its own module."""
from __future__ import annotations

import typer

app = typer.Typer(
    help="kernelsearch: tune Triton kernels per workload case, keep the best configs, serve them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.command("kernels")
def kernels_cmd(
    name: str = typer.Argument(None, help="a kernel: show its parameters and suite cases"),
    as_json: bool = typer.Option(False, "--json", help="JSON for scripts"),
) -> None:
    """List the kernels, or one kernel's tunable parameters and suite cases."""
    import json

    from kernelsearch.kernels import all_kernels, get_kernel

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
        raise typer.BadParameter(str(exc.args[0]), param_hint="NAME") from None
    if as_json:
        d = k.describe()
        d["cases"] = [{"case": c.number, **c.axes} for c in k.cases]
        print(json.dumps(d, indent=1))
        return
    print(f"kernel: {k.name}\nproblem: {k.benchmark_problem}\naxes: {', '.join(a.name for a in k.axes)}")
    for p in k.params:
        cond = f" (when {', '.join(f'{a} in {list(v)}' for a, v in p.requires.items())})" if p.requires else ""
        print(f"param: {p.name}\tdefault={p.default!r}\tchoices={list(p.choices)}{cond}\t{p.doc}")
    for c in k.cases:
        print(f"case: {c.number}\t" + "\t".join(f"{a}={v}" for a, v in c.axes.items()))


def _register() -> None:
    from . import cli_bench, cli_db, cli_optuna, cli_serve, cli_tune

    for mod in (cli_db, cli_tune, cli_bench, cli_serve, cli_optuna):
        mod.register(app)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
