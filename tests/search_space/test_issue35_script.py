"""The issue-35 GPU script's logic on CPU (its `toy` library under the interpreter): a key's
search, gate, re-measure and sweep run end to end and the table adds them up; a kernel whose
pruner makes new configs (gemlite's) is searched through that pruner."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import triton

from kernelsearch.kernels.configs import canonical
from kernelsearch.search_space.through_pruner import PrunedRuns, through_pruner

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "benchmarks" / "issue35_search.py"


@pytest.fixture
def script(monkeypatch):
    for k, v in {"KS35_TRIALS": "3", "KS35_REPEATS": "3", "KS35_DRAWS": "1"}.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("issue35_search", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fitted(monkeypatch):
    """The corpus's gemlite-like kernel: its pruner yields configs with EVEN, which no listed
    config sets, and caps BLOCK at the call's size."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "autotune"))
    from corpus_pkg import rewriting_prune

    kernel = rewriting_prune._fitted_square_kernel
    monkeypatch.setattr(kernel, "_do_bench", lambda fn, quantiles=None, **_: [1.0, 1.0, 1.0])
    saved = list(kernel.configs)
    yield rewriting_prune
    kernel.configs = saved
    kernel.cache.clear()
    sys.modules.pop("corpus_pkg.rewriting_prune", None)


def test_the_issue35_script_searches_a_toy_key_and_serves_no_wrong_result(tmp_path, script) -> None:
    got = script.run_lib("toy", tmp_path, deadline_s=14)
    (row,) = got["keys"]
    assert "error" not in row, row
    assert row["listed"] == 2 and row["derived_space"] == 288
    assert row["evaluated_beyond_list"] == 3 and row["wrong_served"] == 0
    assert row["served"] in ("list", "search")
    assert row["sweep_configs"] >= row["search_ran"] == 5 and not row["sweep_exhaustive"]
    # Within 2 % of the best found: the search's count is a position in what it ran, or never.
    assert row["search_to_2pct"] is None or 1 <= row["search_to_2pct"] <= 5
    assert row["sweep_to_2pct"] is not None  # the sweep re-uses the search's timings: it holds the best
    summary = script.table(tmp_path)
    assert summary["keys_ok"] == 1 and summary["wrong_results_served"] == 0
    key = summary["per_key"]["toy/toy_mm"]
    assert key["search_ran"] == 5 and key["derived_space"] == 288


def test_a_candidate_runs_as_the_kernels_pruner_makes_it(fitted) -> None:
    kernel = fitted._fitted_square_kernel
    before = list(kernel.configs)
    made = through_pruner(kernel, triton.Config({"BLOCK": 1024}, num_warps=4), {"n": 96}, {})
    assert [canonical(c)["BLOCK"] for c in made] == [128]
    assert canonical(made[0])["EVEN"] is False
    assert kernel.configs == before  # given back
    pr = PrunedRuns(kernel)
    try:
        pr.use(triton.Config({"BLOCK": 1024}, num_warps=2))
        y = fitted.run()["y"]
        x = fitted.inputs(50, 96)
        assert (y == x * x).all()
        (ran,) = pr.ran
        assert json.loads(json.dumps(pr.made[ran]))["BLOCK"] == 128
    finally:
        pr.undo()
    assert "run" not in kernel.__dict__


def test_the_issue35_script_searches_a_kernel_whose_pruner_makes_new_configs(tmp_path, script,
                                                                            fitted, monkeypatch) -> None:
    def fitted_op(seed: int):
        x = fitted.inputs(seed, 96)

        def op() -> list:
            y = x.new_empty(96)
            fitted._fitted_square_kernel[fitted.grid1d(96)](x, y, 96)
            return [y]
        return op

    monkeypatch.setattr(script, "toy_ops", lambda: {"fitted": fitted_op})
    (row,) = script.run_lib("toy", tmp_path, deadline_s=14)["keys"]
    assert "error" not in row, row
    assert row["list_best_us"] > 0 and row["failed_configs"] == 0
    assert row["pruner_rewrote"] >= row["listed"]  # every candidate got its EVEN
    # Candidates the pruner made the same config are one: BLOCK capped at 128 (8 to 128), its
    # num_warps kept, num_stages dropped.
    assert row["distinct_configs_ran"] <= 5 * 5 < row["sweep_configs"]
    assert row["wrong_served"] == 0
