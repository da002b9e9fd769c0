"""`kernelsearch tune` end to end on SQLite under the interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from kernelsearch.service.cli import app
from kernelsearch.service.cli_format import format_latency

KA = "vision_rope_generation_bwd"
KB = "vision_rope3d_spatial_merge_bwd"


def _invoke(*args: str, columns: int = 400):
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    return r.exit_code, " ".join(r.output.replace("│", " ").split())


def test_tune_cli_end_to_end(sqlite_url, tmp_path):
    out = tmp_path / "res.json"
    res = CliRunner().invoke(app, [
        "tune", KA, "--case", "total_patches=2", "--case", "total_patches=3,num_images=1",
        "--trials", "2", "--sampler", "random", "--seed", "1", "--measure-n", "2",
        "--url", sqlite_url, "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "cpu (triton interpreter)" in res.output and "total_patches=3" in res.output
    doc = json.loads(out.read_text())
    # num_images is informational: accepted, not part of the case's key.
    assert [d["axes"] for d in doc] == [{"total_patches": 2}, {"total_patches": 3}]
    assert all(d["n_complete"] + d["n_failed"] == 2 for d in doc)
    from kernelsearch.db.store import Store

    with Store(sqlite_url) as store:
        recs = store.list_records(KA)
    assert sorted(r.axes["total_patches"] for r in recs) == [2, 3]
    # Tuning again adds trials to the same study: the earlier ones are kept, not re-run.
    code, text = _invoke("tune", KA, "--case", "total_patches=2", "--trials", "1",
                         "--url", sqlite_url, "--measure-n", "2", "--json", str(out))
    assert code == 0, text
    assert "new trials: 1 (1 ok, 0 failed); the study holds 3" in text
    (again,) = json.loads(out.read_text())
    assert again["n_run_now"] == 1 and again["n_complete"] == 3
    # The best latency in the unit that fits it (a trial under the interpreter takes ms to s).
    assert f"best {format_latency(again['best_latency_us'])}, record" in text


def test_latencies_are_printed_in_the_unit_that_fits():
    assert format_latency(1642731.05) == "1.64 s"
    assert format_latency(12.345) == "12.35 us"
    assert format_latency(2500.0) == "2.50 ms"
    assert format_latency(0.83) == "830.00 ns"
    assert format_latency(999.999) == "1.00 ms"
    assert format_latency(None) == "-" and format_latency(float("nan")) == "-"


def test_suite_case_numbers_and_axes_give_the_same_case(sqlite_url):
    from kernelsearch.kernels import get_kernel
    from kernelsearch.service.cli_tune import parse_case

    kb = get_kernel(KB)
    assert parse_case(kb, "4") == kb.case(4).axes
    assert parse_case(kb, f"seq_len={kb.case(4).axes['seq_len']}") == kb.case(4).axes
    assert parse_case(get_kernel(KA), " total_patches = 7 , num_images=2") == {"total_patches": 7}


def test_tune_cli_rejects_bad_input(sqlite_url):
    # No per-kernel flags: every kernel's cases are given the same way.
    code, text = _invoke("tune", KB, "--total-patches", "4", "--url", sqlite_url)
    assert code != 0 and "No such option" in text
    code, text = _invoke("tune", KB, "--case", "total_patches=4", "--url", sqlite_url)
    assert code != 0 and "unknown axis 'total_patches'" in text and "seq_len" in text
    code, text = _invoke("tune", KB, "--case", "seq_len=0", "--url", sqlite_url)
    assert code != 0 and "outside" in text
    code, text = _invoke("tune", KB, "--case", "seq_len", "--url", sqlite_url)
    assert code != 0 and "AXIS=VALUE" in text
    code, text = _invoke("tune", KB, "--case", "seq_len=4,seq_len=5", "--url", sqlite_url)
    assert code != 0 and "given twice" in text
    code, text = _invoke("tune", "no_such", "--all", "--url", sqlite_url)
    assert code != 0 and "unknown kernel" in text
    # The hint names this kernel's axes (it named A's flag for B).
    code, text = _invoke("tune", KB, "--url", sqlite_url)
    assert code != 0 and "--case seq_len=" in text and "total_patches" not in text
    code, text = _invoke("tune", KB, "--case", "99", "--url", sqlite_url)
    assert code != 0 and "no suite case 99" in text


def test_a_tune_without_a_record_fails_with_reasons_then_more_trials_can_be_added(
        sqlite_url, tmp_path):
    """Every trial fails (a limit no trial meets): exit 1 with the kinds, counts and first
    message, and no Optuna log line in the output. Then `--trials 1` on the same case runs one
    new trial: the failed ones do not use up the new run's budget."""
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("KS_SERVICE_URL", None)
    cmd = [sys.executable, "-m", "kernelsearch.service.cli", "tune", KA, "--case",
           "total_patches=5", "--sampler", "random", "--seed", "2", "--measure-n", "2",
           "--url", sqlite_url]
    p = subprocess.run([*cmd, "--trials", "2", "--trial-timeout", "0.01"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "no record: 2 of this run's trials failed (timeout 2)" in p.stderr
    assert "first: trial exceeded 0.01 s" in p.stderr
    both = p.stdout + p.stderr
    assert "A new study created" not in both and "Trial 0 finished" not in both, both
    p = subprocess.run([*cmd, "--trials", "1", "--json", str(tmp_path / "r.json")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (res,) = json.loads((tmp_path / "r.json").read_text())
    assert res["n_run_now"] == 1 and res["n_failed"] == 2 and res["best_latency_us"] is not None
    # At 120 columns nothing is cut: the whole best config is printed.
    assert json.dumps(res["best_config"], sort_keys=True) in p.stdout.replace("\n", "")
    assert "…" not in p.stdout


def test_tune_names_a_missing_space_file_without_a_traceback(sqlite_url):
    import dataclasses
    from pathlib import Path

    from kernelsearch.kernels import get_kernel, register
    from kernelsearch.kernels.registry import unregister

    base = get_kernel(KA)
    register(dataclasses.replace(base, name="ks_missing_space", space="spaces/missing.toml"))
    try:
        res = CliRunner().invoke(app, ["tune", "ks_missing_space", "--case", "1", "--url", sqlite_url])
    finally:
        unregister("ks_missing_space")
    where = Path(sys.modules[base.module].__file__).resolve().parent / "spaces" / "missing.toml"
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert str(where) in res.stderr
