"""`kernelsearch tune` end to end on SQLite under the interpreter."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from kernelsearch.service.cli import app


def test_tune_cli_end_to_end(sqlite_url, tmp_path):
    out = tmp_path / "res.json"
    res = CliRunner().invoke(app, [
        "tune", "vision_rope_generation_bwd", "--total-patches", "2", "--total-patches", "3",
        "--trials", "2", "--sampler", "random", "--seed", "1", "--measure-n", "2",
        "--url", sqlite_url, "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "cpu (triton interpreter)" in res.output and "total_patches=3" in res.output
    doc = json.loads(out.read_text())
    assert [d["axes"] for d in doc] == [{"total_patches": 2}, {"total_patches": 3}]
    assert all(d["n_complete"] + d["n_failed"] == 2 for d in doc)
    from kernelsearch.db.store import Store

    with Store(sqlite_url) as store:
        recs = store.list_records("vision_rope_generation_bwd")
    assert sorted(r.axes["total_patches"] for r in recs) == [2, 3]
    # Tuning again resumes the same studies: nothing new to run.
    code, text = _invoke("tune", "vision_rope_generation_bwd", "--total-patches", "2",
                         "--trials", "2", "--url", sqlite_url, "--measure-n", "2")
    assert code == 0, text
    assert "n_trials" in text


def _invoke(*args: str):
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})
    return r.exit_code, " ".join(r.output.replace("│", " ").split())


def test_tune_cli_rejects_bad_input(sqlite_url):
    code, text = _invoke("tune", "vision_rope3d_spatial_merge_bwd", "--total-patches", "4",
                                 "--url", sqlite_url)
    assert code != 0 and "no axis total_patches" in text
    code, text = _invoke("tune", "no_such", "--all", "--url", sqlite_url)
    assert code != 0 and "unknown kernel" in text
    code, text = _invoke("tune", "vision_rope3d_spatial_merge_bwd", "--url", sqlite_url)
    assert code != 0 and "--case" in text
    code, text = _invoke("tune", "vision_rope3d_spatial_merge_bwd", "--case", "99",
                                 "--url", sqlite_url)
    assert code != 0 and "no suite case 99" in text
