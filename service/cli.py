"""`kernelsearch` command line: each area registers its commands from its own module."""
from __future__ import annotations

import typer

app = typer.Typer(
    help="kernelsearch: tune Triton kernels per workload case, keep the best configs, serve them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from . import cli_bench, cli_db, cli_serve, cli_tune

    for mod in (cli_db, cli_tune, cli_bench, cli_serve):
        mod.register(app)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
