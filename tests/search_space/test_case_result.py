"""`CaseResult.as_dict()` is what `kernelsearch tune --json` writes and a job's reader expects: the
flat keys in their order, whatever the grouping of the result's parts."""
from __future__ import annotations

import json

from kernelsearch.search_space.states import StopReason
from kernelsearch.search_space.tuner import (BestFound, CaseKey, CaseResult, Failures, PhaseTimes,
                                             TrialCounts)

KEYS = ["kernel", "axes", "device", "study_name", "sampler", "best_config", "best_latency_us",
        "n_complete", "n_failed", "improved", "compile_s", "check_s", "measure_s",
        "stopped_because", "n_rejected", "n_cached", "n_run_now", "wall_s", "compile_wait_s",
        "warm_started", "timing_method", "record_id", "history", "n_counted",
        "new_failure_kinds", "failure_kinds", "first_failure"]


def _result() -> CaseResult:
    return CaseResult(
        key=CaseKey(kernel="k", axes={"n": 24}, device="cpu", study_name="ks/k/n=24/cpu",
                    sampler="tpe"),
        stopped_because=StopReason.N_TRIALS,
        best=BestFound(config={"BLOCK": 64}, latency_us=12.5, timing_method="wallclock",
                       improved=True, record_id=7),
        trials=TrialCounts(n_complete=3, n_failed=2, n_rejected=1, n_cached=4, n_run_now=5,
                           n_counted=6, warm_started=8, history=[12.5, None]),
        times=PhaseTimes(compile_s=0.25, check_s=0.5, measure_s=0.75, compile_wait_s=1.25,
                         wall_s=2.5),
        failures=Failures(new_kinds={"wrong_result": 1}, kinds={"wrong_result": 2},
                          first="boom"))


def test_as_dict_keeps_the_flat_keys_order_and_values() -> None:
    got = _result().as_dict()
    assert list(got) == KEYS
    assert json.dumps(got, default=str) == (
        '{"kernel": "k", "axes": {"n": 24}, "device": "cpu", "study_name": "ks/k/n=24/cpu", '
        '"sampler": "tpe", "best_config": {"BLOCK": 64}, "best_latency_us": 12.5, '
        '"n_complete": 3, "n_failed": 2, "improved": true, "compile_s": 0.25, "check_s": 0.5, '
        '"measure_s": 0.75, "stopped_because": "n_trials", "n_rejected": 1, "n_cached": 4, '
        '"n_run_now": 5, "wall_s": 2.5, "compile_wait_s": 1.25, "warm_started": 8, '
        '"timing_method": "wallclock", "record_id": 7, "history": [12.5, null], "n_counted": 6, '
        '"new_failure_kinds": {"wrong_result": 1}, "failure_kinds": {"wrong_result": 2}, '
        '"first_failure": "boom"}')
    assert got["stopped_because"] is StopReason.N_TRIALS


def test_as_dict_is_a_copy() -> None:
    res = _result()
    got = res.as_dict()
    got["axes"]["n"] = 1
    got["history"].append(3.0)
    assert res.key.axes == {"n": 24} and res.trials.history == [12.5, None]


def test_a_result_with_nothing_found_has_the_defaults() -> None:
    res = CaseResult(key=CaseKey("k", {"n": 1}, "cpu", "s", "grid"),
                     stopped_because=StopReason.SPACE_EXHAUSTED)
    got = res.as_dict()
    assert got["best_config"] is None and got["n_complete"] == 0 and got["history"] == []
    assert res.failure_summary() == "no config was measured: every config of the space was already tried"
