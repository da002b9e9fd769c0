"""The issue-35 GPU script's logic on CPU (its `toy` library under the interpreter): a key's
search, gate, re-measure and sweep run end to end and the table adds them up."""
from __future__ import annotations

import importlib.util
from pathlib import Path


SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "issue35_search.py"


def test_the_issue35_script_searches_a_toy_key_and_serves_no_wrong_result(tmp_path, monkeypatch) -> None:
    for k, v in {"KS35_TRIALS": "3", "KS35_SWEEP": "2", "KS35_REPEATS": "3", "KS35_DRAWS": "1"}.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("issue35_search", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.run_lib("toy", tmp_path)
    (row,) = got["keys"]
    assert "error" not in row, row
    assert row["listed"] == 2 and row["derived_space"] == 288
    assert row["evaluated_beyond_list"] == 3 and row["wrong_served"] == 0
    assert row["served"] in ("list", "search")
    summary = mod.table(tmp_path)
    assert summary["keys_ok"] == 1 and summary["wrong_results_served"] == 0
    assert summary["searched_configs_per_key"] == [3]
