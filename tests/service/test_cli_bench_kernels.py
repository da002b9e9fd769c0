"""`kernelsearch kernels` and `kernelsearch bench` end to end under the interpreter."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from kernelsearch.service.cli import app

runner = CliRunner()


def test_kernels_lists_both():
    res = runner.invoke(app, ["kernels"])
    assert res.exit_code == 0, res.output
    names = [line.split("\t")[0] for line in res.output.strip().splitlines()]
    # Other tests in this process may register test-only kernels beside these two.
    assert {"vision_rope_generation_bwd", "vision_rope3d_spatial_merge_bwd"} <= set(names)
    assert names == sorted(names)


def test_kernels_json_has_cases_and_params():
    res = runner.invoke(app, ["kernels", "vision_rope3d_spatial_merge_bwd", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert [c["case"] for c in d["cases"]] == list(range(1, 17))
    assert {"ROWS", "HEADS", "BLOCK_D", "GRID", "TRIG"} <= {p["name"] for p in d["params"]}


def test_kernels_unknown_is_an_error():
    res = runner.invoke(app, ["kernels", "nope"])
    assert res.exit_code != 0
    assert "nope" in res.output


def test_bench_default_config_interpreter(tmp_path):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--case", "6", "--default",
                              "--n", "2", "--no-references", "--json", str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())["reports"][0]
    row = rep["rows"][0]
    assert row["case"] == 6 and row["axes"] == {"total_patches": 131}
    assert row["correct"] is True and row["config_source"] == "default"
    assert rep["method"] == "interpreter-wallclock"
    assert row["roofline_us"] is None  # no roofline without a GPU's copy bandwidth
    assert png.stat().st_size > 1000
    assert "total_patches=131" in res.output


def test_bench_rejects_bad_config_and_case():
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--config", "{not json"])
    assert res.exit_code != 0
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--case", "99", "--default"])
    assert res.exit_code != 0 and "99" in res.output
