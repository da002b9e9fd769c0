"""`kernelsearch db ...` and `kernelsearch records ...` through typer's CliRunner."""
from __future__ import annotations

from trusted_records import trusted

import json
import sqlite3

import pytest
from helpers import KERNEL, make_record
from sqlalchemy import make_url
from typer.testing import CliRunner

from kernelsearch.db.engine import head_revision
from kernelsearch.db.store import Store
from kernelsearch.kernels import get_kernel
from kernelsearch.service.cli import app

runner = CliRunner()
# A complete config of KERNEL: `records import` refuses a partial one (the acceptance gate).
FULL = get_kernel(KERNEL).default_config


def run(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


def test_upgrade_and_current(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        sqlite3.connect(make_url(db_url).database).close()  # an empty database, not a missing one
    before = run("db", "current", "--url", db_url, "--check")
    assert before.exit_code == 1
    assert "current: none" in before.stdout and "kernelsearch db upgrade" in before.stdout
    up = run("db", "upgrade", "--url", db_url)
    assert up.exit_code == 0, up.output
    assert f"revision: {head_revision()}" in up.stdout
    after = run("db", "current", "--url", db_url, "--check")
    assert after.exit_code == 0 and "status: up to date" in after.stdout


def test_records_commands_refuse_an_unmigrated_database(sqlite_url: str) -> None:
    res = run("records", "list", "--url", sqlite_url)
    assert res.exit_code == 1
    assert "run `kernelsearch db upgrade`" in res.stderr


def test_export_import_list(store: Store, tmp_path, make_db_url) -> None:
    store.upsert_best(trusted(make_record(5.0, minutes=0, config=FULL)))
    store.upsert_best(trusted(make_record(4.0, minutes=1, config={**FULL, "BLOCK_P": 64})))
    store.upsert_best(trusted(make_record(2.0, axes={"seq_len": 8}, kernel="vision_rope3d_spatial_merge_bwd")))

    out = tmp_path / "export" / "records.json"
    res = run("records", "export", "--url", store.url, "--kernel", KERNEL, "--history", str(out))
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "kernelsearch.records" and len(doc["records"]) == 2
    assert {r["kernel"] for r in doc["records"]} == {KERNEL}

    stdout = run("records", "export", "--url", store.url, "-")
    assert stdout.exit_code == 0 and len(json.loads(stdout.stdout)["records"]) == 2

    target = make_db_url("sqlite")
    assert run("db", "upgrade", "--url", target).exit_code == 0
    first = run("records", "import", "--url", target, str(out))
    assert first.exit_code == 0, first.output
    assert "added: 2" in first.stdout and "superseded: 1" in first.stdout
    second = run("records", "import", "--url", target, str(out))
    assert "added: 0" in second.stdout and "unchanged: 2" in second.stdout
    skipped = run("records", "import", "--url", target, "--if-empty", str(out))
    assert skipped.exit_code == 0 and "skipped" in skipped.stdout

    listed = run("records", "list", "--url", target, "--history")
    lines = listed.stdout.strip().splitlines()
    assert lines[0].startswith("kernel\tdevice") and len(lines) == 3
    assert sum("\tcurrent\t" in ln for ln in lines) == 1
    as_json = json.loads(run("records", "list", "--url", target, "--json").stdout)
    assert [r["latency_median_us"] for r in as_json] == [4.0]


def test_import_if_empty_imports_into_an_empty_database(sqlite_url: str, tmp_path) -> None:
    assert run("db", "upgrade", "--url", sqlite_url).exit_code == 0
    with Store(sqlite_url) as s:
        s.upsert_best(trusted(make_record(3.0, config=FULL)))
        doc = s.export_records()
    f = tmp_path / "shipped.json"
    f.write_text(json.dumps(doc))
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert run("db", "upgrade", "--url", fresh).exit_code == 0
    res = run("records", "import", "--if-empty", "--url", fresh, str(f))
    assert res.exit_code == 0 and "added: 1" in res.stdout


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[" + "9" * 5000 + "]", "not valid JSON"),  # past Python's int digits limit
        (json.dumps({"schema": "kernelsearch.records", "version": 1, "records": [{"kernel": "k"}]}), "records[0]"),
        (json.dumps({"schema": "kernelsearch.records", "version": 99, "records": []}), "unsupported version"),
    ],
)
def test_bad_import_file_exits_1_with_message(store: Store, tmp_path, content: str, message: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    res = run("records", "import", "--url", store.url, str(f))
    assert res.exit_code == 1 and message in res.stderr
    assert store.list_records(include_history=True) == []


def test_import_from_stdin_and_missing_file(store: Store, tmp_path) -> None:
    doc = {"schema": "kernelsearch.records", "version": 1, "records": []}
    res = run("records", "import", "--url", store.url, "-", input=json.dumps(doc))
    assert res.exit_code == 0 and "added: 0" in res.stdout
    missing = run("records", "import", "--url", store.url, str(tmp_path / "nope.json"))
    assert missing.exit_code == 1 and "cannot read" in missing.stderr


def test_records_list_names_the_known_kernels_for_an_unknown_one(store: Store) -> None:
    store.upsert_best(trusted(make_record(4.0)))
    res = run("records", "list", "--url", store.url, "--kernel", "nope")
    assert res.exit_code == 1
    assert "unknown kernel 'nope'" in res.stderr and KERNEL in res.stderr
    # A kernel that is known but has no records is an empty listing, not an error.
    empty = run("records", "list", "--url", store.url, "--kernel", "vision_rope3d_spatial_merge_bwd")
    assert empty.exit_code == 0 and len(empty.stdout.strip().splitlines()) == 1


def test_records_list_prints_latency_in_a_fitting_unit(store: Store) -> None:
    store.upsert_best(trusted(make_record(1642731.05)))
    store.upsert_best(trusted(make_record(4.0, axes={"seq_len": 8})))
    lines = run("records", "list", "--url", store.url).stdout.strip().splitlines()
    medians = sorted(ln.split("\t")[3] for ln in lines[1:])
    assert lines[0].split("\t")[3] == "median" and medians == ["1.64 s", "4.00 us"]
