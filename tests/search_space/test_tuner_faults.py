"""The tuner's side of issue 16: a study held under its claim (`exclusive`) keeps no RUNNING
trial after a failing loop, and a trial Optuna recorded without its history row (a worker killed
between the two) gets the row when the study is resumed."""
from __future__ import annotations

import pytest
from optuna.trial import TrialState

from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.search_space.tuner import A_RUN, TuneOptions, study_name, tune_case

KERNEL = "vision_rope_generation_bwd"
AXES = {"total_patches": 2}


class BrokenRunner:
    """A runner whose candidates raise: a failure the tuner does not catch."""

    compile_workers = 0
    device_name = INTERPRETER_DEVICE
    device_info = {"name": INTERPRETER_DEVICE, "interpreter": True}

    def run(self, *args, **kwargs):
        raise RuntimeError("runner broke mid-trial")

    def prefetch(self, *args, **kwargs) -> int:
        return 0


def _trials(url: str, state: TrialState):
    import optuna

    study = optuna.load_study(study_name=study_name(KERNEL, AXES, INTERPRETER_DEVICE), storage=url)
    return study.get_trials(deepcopy=False, states=(state,))


@pytest.mark.parametrize("exclusive", [True, False])
def test_failing_loop_leaves_no_running_trial_under_the_claim(sqlite_store, exclusive) -> None:
    with pytest.raises(RuntimeError, match="broke"):
        tune_case(KERNEL, AXES, store=sqlite_store, storage=sqlite_store.url, runner=BrokenRunner(),
                  options=TuneOptions(n_trials=2, sampler="random", exclusive=exclusive, warm_start=False))
    running = _trials(sqlite_store.url, TrialState.RUNNING)
    assert len(running) == (0 if exclusive else 1)


def test_missing_history_row_is_repaired_on_resume(sqlite_store, runner) -> None:
    url = sqlite_store.url
    tune_case(KERNEL, AXES, store=sqlite_store, storage=url, runner=runner,
              options=TuneOptions(n_trials=2, sampler="random", measure_n=1, warm_start=False))
    evaluated = [t.number for t in _trials(url, TrialState.COMPLETE) if t.user_attrs.get(A_RUN)]
    assert len(evaluated) == 2
    with sqlite_store.engine.begin() as conn:  # as if the worker died before the second row
        conn.exec_driver_sql("DELETE FROM ks_trials WHERE trial_number = ?", (evaluated[1],))
    tune_case(KERNEL, AXES, store=sqlite_store, storage=url, runner=runner,
              options=TuneOptions(n_trials=2, sampler="random", measure_n=1, warm_start=False))
    rows = sqlite_store.trial_summaries(KERNEL, INTERPRETER_DEVICE, AXES)
    assert sorted(r["trial_number"] for r in rows) == sorted(evaluated)
    (fixed,) = [r for r in rows if r["trial_number"] == evaluated[1]]
    assert fixed["extra"]["repaired"] and fixed["state"] in ("complete", "fail")
    assert fixed["config"] and (fixed["state"] == "fail" or fixed["latency_median_us"] > 0)
