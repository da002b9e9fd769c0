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


def test_kernels_prints_the_declaration():
    res = runner.invoke(app, ["kernels", "vision_rope_generation_bwd"])
    assert res.exit_code == 0, res.output
    from kernelsearch.kernels import get_kernel

    k = get_kernel("vision_rope_generation_bwd")
    assert f"axis: total_patches\t1..{k.axes[0].maximum}" in res.output
    assert f"default config: {json.dumps(k.default_config, sort_keys=True)}" in res.output
    assert "case: 6\ttotal_patches=131" in res.output
    d = json.loads(runner.invoke(app, ["kernels", k.name, "--json"]).output)
    assert d["default_config"] == k.default_config and d["axes"][0]["name"] == "total_patches"


def test_help_shows_flags_without_a_value():
    """`--json <bool>` read as an option taking a value; no help of any command says so."""
    import typer

    def commands(group, path):
        for name, cmd in getattr(group, "commands", {}).items():
            yield [*path, name]
            yield from commands(cmd, [*path, name])

    top = typer.main.get_command(app)
    paths = list(commands(top, []))
    assert ["kernels"] in paths and ["tune"] in paths
    for path in paths:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, (path, res.output)
        assert "<bool>" not in res.output, (path, res.output)
    res = runner.invoke(app, ["kernels", "--help"], env={"COLUMNS": "200"})
    assert any(line.split()[:1] == ["--json"] for line in res.output.splitlines()), res.output


def test_bench_refuses_a_config_the_kernel_rejects():
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--config", '{"BLOCK_P": 7}'])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "BLOCK_P" in res.output and "Traceback" not in res.output


def test_bench_checks_output_paths_before_the_work(tmp_path):
    out = tmp_path / "b.json"
    for opt in ("--plot", "--table", "--json"):
        args = ["bench", "vision_rope_generation_bwd", "--case", "6", "--default", "--n", "1",
                "--no-references", "--json", str(out), opt, "/nonexistent/x.png"]
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
        assert "/nonexistent" in res.output
        # Refused before benchmarking: the report, written before the plot, is not there.
        assert not out.exists()
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--default", "--plot",
                              str(tmp_path)])
    assert res.exit_code == 2 and "is a directory" in res.output


def test_bench_takes_a_case_by_its_axes(tmp_path):
    out = tmp_path / "b.json"
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--case", "total_patches=131",
                              "--case", "total_patches=3", "--default", "--n", "1",
                              "--no-references", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["reports"][0]["rows"]
    # 131 patches is suite case 6; 3 is no suite case.
    assert [(r["case"], r["axes"]) for r in rows] == [(6, {"total_patches": 131}),
                                                      (None, {"total_patches": 3})]
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--case", "seq_len=3"])
    assert res.exit_code == 2 and "unknown axis 'seq_len'" in res.output


def test_bench_warns_about_the_interpreter_and_shows_progress(monkeypatch):
    """A bare `bench KERNEL` under the interpreter says up front how many cases it will take
    hours over, and counts them off while it runs (the benchmark itself is stubbed here)."""
    import kernelsearch.kernels.bench as kb
    from kernelsearch.kernels import get_kernel

    def fake_bench(k, cases, *, progress=None, **_kw):
        for axes in cases:
            progress(f"{k.name} {axes} default")
        return {"kernel": k.name, "rows": []}

    monkeypatch.setattr(kb, "bench_cases", fake_bench)
    monkeypatch.setattr(kb, "format_table", lambda rep: f"table of {rep['kernel']}")
    n = len(get_kernel("vision_rope_generation_bwd").cases)
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--default", "--n", "1"])
    assert res.exit_code == 0, res.output
    assert f"warning: {n} cases of 1 kernel(s) under the Triton interpreter" in res.stderr
    assert "hours" in res.stderr and f"{n}/{n}" in res.stderr
    assert "table of vision_rope_generation_bwd" in res.stdout
    # Given cases: no warning.
    res = runner.invoke(app, ["bench", "vision_rope_generation_bwd", "--case", "6", "--default"])
    assert res.exit_code == 0 and "warning" not in res.stderr and "1/1" in res.stderr


def test_kernels_shows_categorical_choices_and_a_listed_space(monkeypatch):
    """A categorical axis lists its values (not 1..2147483647); a space given as a list of
    configs is printed as those configs, not as independent choices per parameter."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "plugins"))
    monkeypatch.delenv("KS_KERNEL_MODULES", raising=False)  # restored: --kernel-module sets it
    res = runner.invoke(app, ["--kernel-module", "ks_user_axpy", "kernels", "ks_user_axpy"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert "axis: dtype\tone of float16, float32\telement type of x, y and out" in lines
    assert not any("2147483647" in ln for ln in lines)
    assert not any(ln.startswith("param:") and "choices=" in ln for ln in lines)
    configs = [json.loads(ln.removeprefix("config: ")) for ln in lines if ln.startswith("config: ")]
    assert [(c["BLOCK"], c["num_warps"]) for c in configs] == [(32, 1), (64, 2), (128, 4)]
    as_json = json.loads(runner.invoke(app, ["kernels", "ks_user_axpy", "--json"]).stdout)
    assert as_json["configs"] == configs
