"""The shipped H200 records: `records import --if-empty` of an export, then served by the API."""
from __future__ import annotations

from trusted_records import trusted

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from svc_helpers import H200, KA, KB, record, settings_for
from typer.testing import CliRunner

from kernelsearch import kernels
from kernelsearch.db.engine import upgrade
from kernelsearch.db.store import Store
from kernelsearch.db.wire import parse_records_doc
from kernelsearch.service.api import create_app
from kernelsearch.service.cli import app as cli
from kernelsearch.search_space.acceptance import import_check

SHIPPED = Path(__file__).resolve().parents[2] / "service" / "data" / "h200_records.json"


# A complete config: `records import` refuses a partial one (the acceptance gate).
CONFIG = {**kernels.get_kernel(KB).default_config, "ROWS": 2, "num_warps": 2}


def test_import_if_empty_then_served(tmp_path, sqlite_url: str) -> None:
    src_url = f"sqlite:///{tmp_path / 'gpu.db'}"
    upgrade(src_url)
    with Store(src_url) as gpu:
        gpu.upsert_best(trusted(record(KB, {"seq_len": 128}, 20.0, config=CONFIG)))
        gpu.upsert_best(trusted(record(KA, {"total_patches": 256}, 4.0)))
        doc = gpu.export_records()
    export = tmp_path / "h200_records.json"
    export.write_text(json.dumps(doc))
    upgrade(sqlite_url)
    runner = CliRunner()
    res = runner.invoke(cli, ["records", "import", "--if-empty", str(export)],
                        env={"KS_DATABASE_URL": sqlite_url})
    assert res.exit_code == 0, res.output
    assert "added: 2" in res.output
    res = runner.invoke(cli, ["records", "import", "--if-empty", str(export)],
                        env={"KS_DATABASE_URL": sqlite_url})
    assert res.exit_code == 0 and "skipped" in res.output
    with Store(sqlite_url) as store, TestClient(create_app(settings_for(sqlite_url),
                                                           store=store)) as c:
        b = c.get("/v1/best", params={"kernel": KB, "device": H200, "seq_len": 128}).json()
        assert b["match"] == "exact" and b["config"] == CONFIG
        assert len(c.get("/v1/records", params={"device": H200}).json()) == 2


@pytest.mark.skipif(not SHIPPED.exists(), reason="service/data/h200_records.json not shipped yet")
def test_shipped_file_is_valid_for_this_code() -> None:
    # The same check `records import` (so `make run`) applies.
    recs = parse_records_doc(json.loads(SHIPPED.read_text()), check=import_check)
    assert recs, "the shipped file holds no records"
    for r in recs:
        k = kernels.get_kernel(r.kernel)
        assert k.validate_axes(r.axes) == r.axes
        assert k.validate_config(r.config)
        assert r.timing_method == "cupti" and "H200" in r.device
    suites = {(r.kernel, tuple(sorted(r.axes.items()))) for r in recs}
    builtin = {ep.name for ep in entry_points(group="kernelsearch.kernels")
               if ep.value.startswith("kernelsearch.")}
    for name in sorted(builtin):
        k = kernels.get_kernel(name)
        missing = [c.axes for c in k.cases if (name, tuple(sorted(c.axes.items()))) not in suites]
        assert not missing, f"{name}: suite cases without a shipped record: {missing}"


def _shipped_version() -> int | None:
    return json.loads(SHIPPED.read_text()).get("version") if SHIPPED.exists() else None


@pytest.mark.skipif((_shipped_version() or 0) < 2,
                    reason="the shipped file is export version 1 (no trials): re-export it with this code")
def test_shipped_records_carry_their_trials_and_speedups() -> None:
    for r in parse_records_doc(json.loads(SHIPPED.read_text())):
        label = f"{r.kernel} {r.axes}"
        assert len(r.trials) == r.n_trials, f"{label}: {len(r.trials)} trials shipped, {r.n_trials} reported"
        assert sum(t.state == "fail" for t in r.trials) == r.n_failed, label
        assert r.eager_latency_us and r.speedup_eager, f"{label}: no eager reference"
        assert r.compile_latency_us and r.speedup_compile, f"{label}: no torch.compile reference"
