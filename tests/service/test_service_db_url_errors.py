"""A malformed KS_DATABASE_URL (a raw "@" in the password, a port that is not a number, a driver
nobody has) is one clean line and a non-zero exit from every command that opens the database,
with no part of the password in it; never a traceback."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kernelsearch.db.engine import DatabaseURLError, parse_database_url
from kernelsearch.service.cli import app as cli
from kernelsearch.service.settings import get_settings

SECRET = "Sup3rS3cret"
BAD_URLS = {
    "raw @": f"postgresql+psycopg://ks:{SECRET}@tail-{SECRET}@127.0.0.1:5432/ks",
    "port": f"postgresql+psycopg://ks:{SECRET}@127.0.0.1:5x32/ks",
    "driver": f"postgresql+nodriver://ks:{SECRET}@127.0.0.1:5432/ks",
    "database": f"mongodb://ks:{SECRET}@127.0.0.1:5432/ks",
}
COMMANDS = {
    "worker": ["worker", "--once"],
    "serve": ["serve", "--port", "1"],
    "records export": ["records", "export", "-"],
    "optuna-dashboard": ["optuna-dashboard", "--port", "1"],
}


@pytest.mark.parametrize("kind", BAD_URLS)
def test_parse_says_what_is_wrong_without_the_password(kind: str) -> None:
    with pytest.raises(DatabaseURLError) as err:
        parse_database_url(BAD_URLS[kind])
    msg = str(err.value)
    assert "\n" not in msg and SECRET[:4] not in msg and "tail" not in msg
    assert {"raw @": "%40", "port": "port", "driver": "driver", "database": "unsupported"}[kind] in msg


@pytest.mark.parametrize("kind", BAD_URLS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_says_one_line_and_exits_non_zero(command: str, kind: str) -> None:
    get_settings.cache_clear()
    try:
        res = CliRunner().invoke(cli, COMMANDS[command],
                                 env={"KS_DATABASE_URL": BAD_URLS[kind], "KS_API_TOKEN": ""})
    finally:
        get_settings.cache_clear()
    assert res.exit_code not in (0, None), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "database URL" in lines[0]
    assert SECRET[:4] not in res.output and "tail" not in res.output
