"""The tuner end to end on the test kernel under the interpreter: samplers, failures, resume,
warm start and records."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
import torch
from optuna.trial import TrialState

import ks_fake_kernels
from kernelsearch.search_space.space import SearchSpace, SpaceError
from kernelsearch.search_space.tuner import (SAMPLERS, TuneError, TuneHooks, TuneOptions, make_storage, study_name,
                                             tune_case)

from ss_helpers import FAKE, HERE, TEST_COMPILE_WORKERS, fake_space


def _evaluated(url, name):
    study = optuna.load_study(study_name=name, storage=url)
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("ks_evaluated")]


def _outcomes(store, res) -> list[str]:
    """Each run trial of the case as "config: failure kind (message)", for assertion messages:
    a log from the GPU host then says why a trial failed, not only that it did."""
    rows = store.trial_summaries(FAKE, res.key.device, res.key.axes)
    return [f"{r['config']}: {r['failure_kind'] or 'ok'}"
            + (f" ({(r['message'] or '')[:300]})" if r["failure_kind"] else "") for r in rows]


def test_study_name_is_stable_and_keyed():
    a = study_name("k", {"seq_len": 4}, "NVIDIA H200")
    assert a == study_name("k", {"seq_len": 4}, "NVIDIA H200")
    assert a != study_name("k", {"seq_len": 5}, "NVIDIA H200")
    assert a != study_name("k", {"seq_len": 4}, "cpu (triton interpreter)")


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_tunes_and_writes_a_record(ss_store, runner, sampler):
    store, url = ss_store
    space = fake_space(modes=("ok",), blocks=(16, 32, 64))
    res = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=3, sampler=sampler, seed=0, measure_n=2))
    assert res.trials.n_complete == 3 and res.trials.n_failed == 0 and res.stopped_because in (
        "n_trials", "space_exhausted"), _outcomes(store, res)
    assert res.best.config["MODE"] == "ok" and res.best.latency_us > 0
    assert res.best.improved and res.best.record_id is not None
    (rec,) = store.list_records(FAKE, res.key.device)
    assert rec.config == res.best.config and rec.latency_median_us == res.best.latency_us
    if torch.cuda.is_available():
        assert rec.timing_method == "cupti"
    else:
        assert rec.timing_method == "interpreter-wallclock" and rec.roofline_pct is None
    assert rec.work == 8 * 24 and rec.n_trials == 3


def test_failures_are_typed_remembered_and_never_rerun(ss_store, runner):
    store, url = ss_store
    space = fake_space(modes=("ok", "compile_error", "wrong"), blocks=(16, 32))
    res = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=6, sampler="random", seed=3, measure_n=2))
    # Six distinct configs, each run exactly once, however often random proposed it.
    assert res.trials.n_run_now == 6 and res.trials.n_complete == 2 and res.trials.n_failed == 4, _outcomes(store, res)
    assert res.best.config["MODE"] == "ok"
    rows = store.trial_summaries(FAKE, res.key.device, {"n": 24})
    assert len(rows) == 6
    kinds = sorted(r["failure_kind"] for r in rows if r["state"] == "fail")
    assert kinds == ["compile_error", "compile_error", "wrong_result", "wrong_result"]
    configs = [json.dumps(r["config"], sort_keys=True) for r in rows]
    assert len(set(configs)) == 6
    # Asking for more: the space is exhausted, nothing runs again.
    again = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                      options=TuneOptions(n_trials=10, sampler="tpe", seed=4, measure_n=2))
    assert again.trials.n_run_now == 0 and again.stopped_because == "space_exhausted"
    # TPE saw the failures as infeasible, not as FAIL trials it cannot learn from.
    study = optuna.load_study(study_name=res.key.study_name, storage=url)
    failed = [t for t in study.trials if t.user_attrs.get("ks_state") == "fail"]
    assert failed and all(t.state == TrialState.COMPLETE and t.constraints["ks_failure"] > 0
                          for t in failed)


def test_failed_trials_are_told_to_optuna_as_worse_than_the_measured_ones(ss_store, runner):
    """A failed config is told to Optuna as a violated constraint with a penalty above every
    latency measured before it, so no sampler (nor Optuna's best_trial) takes it for the best."""
    store, url = ss_store
    space = fake_space(modes=("ok", "compile_error", "wrong"), blocks=(16, 32))
    res = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=6, sampler="grid", seed=0, measure_n=2))
    assert res.trials.n_complete == 2 and res.trials.n_failed == 4, _outcomes(store, res)
    study = optuna.load_study(study_name=study_name(FAKE, {"n": 24}, res.key.device), storage=url)
    told = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                  key=lambda t: t.datetime_complete)
    ok_so_far: list[float] = []
    checked = 0
    for t in told:
        failed = t.user_attrs.get("ks_state") != "ok"
        assert (max(t.constraints.values()) > 0) == failed, (t.number, t.constraints, t.user_attrs)
        if not failed:
            ok_so_far.append(t.value)
        elif ok_so_far:
            assert t.value > max(ok_so_far), (t.number, t.value, ok_so_far)
            checked += 1
    assert checked, "no failure was told after a measured config: nothing was compared"
    assert study.best_trial.user_attrs["ks_state"] == "ok"
    assert study.best_value == res.best.latency_us


def test_a_wrong_config_is_never_a_record(ss_store, runner):
    store, url = ss_store
    res = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner,
                    space=fake_space(modes=("wrong",)), options=TuneOptions(n_trials=2, sampler="grid",
                                                                            seed=0, measure_n=2))
    assert res.best.config is None and res.trials.n_failed == 2 and res.best.record_id is None, \
        _outcomes(store, res)
    assert store.list_records(FAKE) == []


def test_crash_and_timeout_are_failed_trials(ss_store):
    from kernelsearch.search_space.runner import TrialRunner

    store, url = ss_store
    with TrialRunner(trial_timeout_s=3.0, kernel_modules=["ks_fake_kernels"],
                     compile_workers=TEST_COMPILE_WORKERS) as r:
        res = tune_case(FAKE, {"n": 8}, store=store, storage=url, runner=r,
                        space=fake_space(modes=("crash", "hang", "ok"), blocks=(16,)),
                        options=TuneOptions(n_trials=3, sampler="grid", seed=0, measure_n=2))
    assert res.trials.n_failed == 2 and res.trials.n_complete == 1, _outcomes(store, res)
    assert res.best.config["MODE"] == "ok"
    kinds = {r["config"]["MODE"]: r["failure_kind"]
             for r in store.trial_summaries(FAKE, res.key.device, {"n": 8})}
    assert kinds == {"crash": "crash", "hang": "timeout", "ok": None}


def test_stops_on_patience_timeout_and_request(ss_store, runner):
    store, url = ss_store
    space = fake_space(modes=("ok",), blocks=(16, 32, 64))
    res = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=3, sampler="random", seed=0, measure_n=2),
                    hooks=TuneHooks(should_stop=lambda: True))
    assert res.stopped_because == "cancelled" and res.trials.n_run_now == 0
    calls = []
    res = tune_case(FAKE, {"n": 16}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=3, sampler="random", seed=0, measure_n=2, timeout_s=1e-6),
                    hooks=TuneHooks(progress=lambda d, n, b: calls.append((d, n, b))))
    assert res.stopped_because == "timeout" and res.trials.n_run_now <= 1
    with pytest.raises(TuneError, match="sampler"):
        tune_case(FAKE, {"n": 16}, store=store, storage=url, runner=runner,
                  options=TuneOptions(n_trials=1, sampler="bogus"))
    with pytest.raises(TuneError, match="axes"):
        tune_case(FAKE, {"n": 0}, store=store, storage=url, runner=runner,
                  options=TuneOptions(n_trials=1))


def test_warm_start_enqueues_the_nearest_cases_best(ss_store, runner):
    store, url = ss_store
    space = fake_space(modes=("ok",), blocks=(16, 32, 64))
    # The neighbours' bests are never the kernel's default (BLOCK 32), which is enqueued first:
    # a neighbour best equal to it would be deduplicated, whichever config timed faster.
    no_default = fake_space(modes=("ok",), blocks=(16, 64))
    near = tune_case(FAKE, {"n": 60}, store=store, storage=url, runner=runner, space=no_default,
                     options=TuneOptions(n_trials=2, sampler="random", seed=1, measure_n=2, warm_start=False))
    far = tune_case(FAKE, {"n": 4000}, store=store, storage=url, runner=runner, space=no_default,
                    options=TuneOptions(n_trials=1, sampler="random", seed=2, measure_n=2, warm_start=False))
    res = tune_case(FAKE, {"n": 64}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=3, sampler="tpe", seed=5, measure_n=2))
    distinct = {json.dumps(c, sort_keys=True) for c in (near.best.config, far.best.config)}
    evaluated = _evaluated(url, res.key.study_name)
    # The kernel's default config is enqueued ahead of the neighbours when the space holds it.
    from_default = [t for t in evaluated if t.user_attrs.get("ks_warm_start_from") == "default"]
    defaults = {json.dumps(t.user_attrs["ks_config"], sort_keys=True) for t in from_default}
    assert res.trials.warm_started == len(distinct | defaults)
    first = [t for t in evaluated if t.user_attrs.get("ks_warm_start_from") != "default"][0]
    assert first.user_attrs["ks_warm_start_from"] == {"n": 60}
    assert first.user_attrs["ks_config"] == near.best.config


_KILLED_TUNER = """
import sys
sys.path.insert(0, {here!r})
from ss_helpers import FAKE, TEST_COMPILE_WORKERS, fake_space
from kernelsearch.db.store import Store
from kernelsearch.search_space.runner import TrialRunner
from kernelsearch.search_space.tuner import TuneOptions, tune_case
if __name__ == "__main__":
    with TrialRunner(trial_timeout_s=30, kernel_modules=["ks_fake_kernels"],
                     compile_workers=TEST_COMPILE_WORKERS) as r:
        tune_case(FAKE, {{"n": 8}}, store=Store({url!r}), storage={url!r}, runner=r,
                  space=fake_space(modes=("ok", "slow"), blocks=(16, 32)),
                  options=TuneOptions(n_trials=4, sampler="grid", seed=0, measure_n=2, heartbeat_s=1))
"""


@pytest.mark.slow
def test_resume_after_a_killed_tuner(ss_store, runner, tmp_path):
    store, url = ss_store
    script = tmp_path / "tuner.py"
    script.write_text(_KILLED_TUNER.format(here=str(HERE), url=url))
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    # The subprocess tunes on this host's device: "NVIDIA H200" on the GPU, not the interpreter's
    # label (a study looked up under that name never appeared there).
    name = study_name(FAKE, {"n": 8}, runner.device_name)
    deadline = time.monotonic() + 120
    running = None
    try:
        while time.monotonic() < deadline and running is None:
            time.sleep(0.2)
            try:
                study = optuna.load_study(study_name=name, storage=url)
            except KeyError:
                continue
            done = _evaluated(url, name)
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if "ks_config" in t.user_attrs and len(done) >= 1:
                    running = t
    finally:
        exited = proc.poll()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if running is None:
        studies = optuna.get_all_study_names(url)
        seen: object = f"no study {name!r} among {studies}"
        if name in studies:
            seen = [(t.number, t.state.name, t.user_attrs.get("ks_config"),
                     t.user_attrs.get("ks_failure_kind"), (t.user_attrs.get("ks_message") or "")[:300])
                    for t in optuna.load_study(study_name=name, storage=url).trials]
        pytest.fail(f"the tuner never reached a second trial (exit code {exited}); "
                    f"its trials: {seen}")
    before = _evaluated(url, name)
    # Until the dead trial is stale by the rule tune_case applies (the same storage settings:
    # heartbeats of 1 s, grace of 3), rather than a fixed 5 s.
    watch = make_storage(url, heartbeat_s=1)
    study_id = watch.get_study_id_from_name(name)
    until = time.monotonic() + 60
    while running._trial_id not in watch._get_stale_trial_ids(study_id):
        assert time.monotonic() < until, "the killed tuner's trial never went stale"
        time.sleep(0.2)
    res = tune_case(FAKE, {"n": 8}, store=store, storage=url, runner=runner,
                    space=fake_space(modes=("ok", "slow"), blocks=(16, 32)),
                    options=TuneOptions(n_trials=4, sampler="grid", seed=0, measure_n=2, heartbeat_s=1))
    after = _evaluated(url, name)
    keys = [json.dumps(t.user_attrs["ks_config"], sort_keys=True) for t in after]
    assert len(after) == 4 and len(set(keys)) == 4, "a trial was lost or run twice"
    assert res.trials.n_run_now == 4 - len(before)
    study = optuna.load_study(study_name=name, storage=url)
    assert study.trials[running.number].state == TrialState.FAIL  # the dead worker's trial
    retried = [t for t in after if t.system_attrs.get("failed_trial") == running.number]
    assert len(retried) == 1 and retried[0].params == running.params


def test_tune_and_resume_on_each_database(store, db_url, runner):
    """Optuna's tables and ours share the database (SQLite, and PostgreSQL when configured)."""
    space = fake_space(modes=("ok", "wrong"), blocks=(16, 32))
    first = tune_case(FAKE, {"n": 16}, store=store, storage=db_url, runner=runner, space=space,
                      options=TuneOptions(n_trials=2, sampler="tpe", seed=0, measure_n=2))
    second = tune_case(FAKE, {"n": 16}, store=store, storage=db_url, runner=runner, space=space,
                       options=TuneOptions(n_trials=4, sampler="tpe", seed=0, measure_n=2))
    assert first.trials.n_run_now == 2 and second.trials.n_run_now == 2
    assert second.trials.n_complete + second.trials.n_failed == 4 and second.trials.n_complete == 2, \
        _outcomes(store, second)
    assert len(store.trial_summaries(FAKE, second.key.device, {"n": 16})) == 4


def test_seeds_are_enqueued_after_the_default(ss_store, runner):
    """The space file's seeds run right after the kernel's default, in file order."""
    store, url = ss_store
    space = SearchSpace.from_dict({
        "kernel": FAKE,
        "param": [{"name": "MODE", "choices": ["ok"]},
                  {"name": "BLOCK", "choices": [16, 32, 64], "ordinal": True}],
        "seed": [{"note": "wide", "BLOCK": 64}, {"BLOCK": 16}],
    }, ks_fake_kernels.KERNEL)
    res = tune_case(FAKE, {"n": 40}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=3, sampler="tpe", seed=3, measure_n=2))
    evaluated = sorted(_evaluated(url, res.key.study_name), key=lambda t: t.number)
    froms = [t.user_attrs.get("ks_warm_start_from") for t in evaluated]
    assert froms == ["default", "seed: wide", "seed: seed #1"]
    assert [t.user_attrs["ks_config"]["BLOCK"] for t in evaluated] == [32, 64, 16]
    assert res.trials.warm_started == 3


def test_a_seed_outside_the_space_is_refused_at_load():
    with pytest.raises(SpaceError, match="seed #0"):
        SearchSpace.from_dict({
            "kernel": FAKE,
            "param": [{"name": "MODE", "choices": ["ok"]},
                      {"name": "BLOCK", "choices": [16, 32], "ordinal": True}],
            "seed": [{"BLOCK": 64}],
        }, ks_fake_kernels.KERNEL)


def test_shipped_seeds_are_valid_and_survive_only_matching_restrictions():
    from kernelsearch.search_space.space import get_space

    a = get_space("vision_rope_generation_bwd")
    assert len(a.seeds) >= 3
    sub = a.restrict({"COLS": ["quarters"]})
    assert sub.seeds and all(c["COLS"] == "quarters" for c, _ in sub.seeds)


def test_a_run_tag_adds_trials_and_failures_are_reported(ss_store, runner):
    """With a run tag, n_trials is what this run adds: a study whose trials all failed still gets
    new ones (before, `n_trials=2` over 4 stored failures ran nothing). A resumed run (the same
    tag) counts its own trials once. Failure kinds are counted per run and per study."""
    store, url = ss_store
    space = fake_space(modes=("wrong", "compile_error", "ok"), blocks=(16, 32, 64))
    first = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner,
                      space=fake_space(
                          modes=("wrong", "compile_error"), blocks=(16, 32)),
                      options=TuneOptions(n_trials=4, sampler="grid", seed=0, measure_n=2, warm_start=False))
    assert first.best.config is None and first.trials.n_failed == 4
    assert first.failures.new_kinds == {"wrong_result": 2, "compile_error": 2}
    assert "4 of this run's trials failed" in first.failure_summary()
    assert first.failures.first and first.failures.first in first.failure_summary()
    untagged = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                         options=TuneOptions(n_trials=2, sampler="random", seed=1, measure_n=2))
    assert untagged.trials.n_run_now == 0 and untagged.stopped_because == "n_trials"
    assert untagged.failures.kinds == {"wrong_result": 2, "compile_error": 2}
    assert "of the study's trials failed" in untagged.failure_summary()
    added = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                      options=TuneOptions(n_trials=2, sampler="random", seed=1, measure_n=2, run_tag="run-a"))
    assert added.trials.n_run_now == 2 and added.trials.n_counted == 2
    assert added.trials.n_complete + added.trials.n_failed == 6
    resumed = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                        options=TuneOptions(n_trials=3, sampler="random", seed=1, measure_n=2,
                                            run_tag="run-a"))
    assert resumed.trials.n_run_now == 1 and resumed.trials.n_counted == 3


def test_measure_n_defaults_to_the_devices_repeats(ss_store, runner):
    from kernelsearch.kernels.measure import default_repeats

    store, url = ss_store
    res = tune_case(FAKE, {"n": 12}, store=store, storage=url, runner=runner,
                    space=fake_space(modes=("ok",), blocks=(16,)), options=TuneOptions(n_trials=1,
                                                                                       sampler="random",
                                                                                       seed=0))
    (trial,) = _evaluated(url, res.key.study_name)
    assert trial.user_attrs["ks_outcome"]["timing"]["n"] == default_repeats(not runner.on_gpu)
    assert default_repeats(interpreter=True) < default_repeats(interpreter=False)


def test_cancel_stops_the_case_and_the_trial_is_run_again_later(ss_store):
    """cancel() during a hanging trial: the case stops "cancelled" without waiting for the trial
    limit; the trial is neither a failure nor remembered, and a later run evaluates it."""
    import threading

    from kernelsearch.search_space.runner import TrialRunner

    store, url = ss_store
    flag = threading.Event()
    space = fake_space(modes=("hang",), blocks=(16,))
    with TrialRunner(trial_timeout_s=600.0, kernel_modules=["ks_fake_kernels"],
                     compile_workers=TEST_COMPILE_WORKERS) as r:
        r.start()
        timer = threading.Timer(1.0, flag.set)
        timer.start()
        try:
            res = tune_case(FAKE, {"n": 8}, store=store, storage=url, runner=r, space=space,
                            options=TuneOptions(n_trials=1, sampler="grid", seed=0, measure_n=2),
                            hooks=TuneHooks(cancel=flag.is_set))
        finally:
            timer.cancel()
        assert res.stopped_because == "cancelled" and res.trials.n_failed == 0 and res.trials.n_counted == 0
        study = optuna.load_study(study_name=res.key.study_name, storage=url)
        assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]
        r2 = TrialRunner(trial_timeout_s=2.0, kernel_modules=["ks_fake_kernels"],
                         compile_workers=TEST_COMPILE_WORKERS)
    with r2:
        again = tune_case(FAKE, {"n": 8}, store=store, storage=url, runner=r2, space=space,
                          options=TuneOptions(n_trials=1, sampler="grid", seed=0, measure_n=2))
    assert again.trials.n_run_now == 1 and again.failures.new_kinds == {"timeout": 1}


@pytest.mark.parametrize("sampler", ["tpe", "grid"])
def test_study_params_are_the_config_fields_and_the_metric_is_named(ss_store, runner, sampler):
    """optuna-dashboard reads a study's params and metric names: one categorical per config
    field over its real values (not `BLOCK__idx` indices or one `grid_id`), latency named."""
    store, url = ss_store
    space = fake_space(modes=("ok",), blocks=(16, 32, 64))
    res = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=3, sampler=sampler, seed=0, measure_n=2))
    study = optuna.load_study(study_name=res.key.study_name, storage=url)
    assert study.metric_names == ["latency_us"]
    trials = _evaluated(url, res.key.study_name)
    assert len(trials) == 3
    for t in trials:
        assert set(t.params) == {"MODE", "BLOCK"}
        assert t.params["BLOCK"] in (16, 32, 64) and t.params["MODE"] == "ok"
        assert t.distributions["BLOCK"] == optuna.distributions.CategoricalDistribution([16, 32, 64])
        assert {k: t.params[k] for k in ("MODE", "BLOCK")} == {
            k: t.user_attrs["ks_config"][k] for k in ("MODE", "BLOCK")}
    if sampler == "grid":
        assert sorted(t.params["BLOCK"] for t in trials) == [16, 32, 64]


@pytest.mark.parametrize("sampler", ["tpe", "grid"])
def test_a_study_of_the_old_param_layout_resumes(ss_store, runner, sampler):
    """A study stored before the layout change (`BLOCK__idx` indices, or a grid's `grid_id`)
    resumes under its own name: its trials count, and the grid does not run them again."""
    store, url = ss_store
    space = fake_space(modes=("ok",), blocks=(16, 32, 64))
    axes = {"n": 24}
    full = space.canonical(space.grid()[0])
    name = study_name(FAKE, axes, runner.device_name)
    old = optuna.create_study(study_name=name, storage=url)
    if sampler == "grid":
        params = {"grid_id": 0}
        dists = {"grid_id": optuna.distributions.CategoricalDistribution([0, 1, 2])}
    else:
        params = {"MODE": "ok", "BLOCK__idx": 0}
        dists = {"MODE": optuna.distributions.CategoricalDistribution(["ok"]),
                 "BLOCK__idx": optuna.distributions.IntDistribution(0, 2)}
    old.add_trial(optuna.trial.create_trial(
        params=params, distributions=dists, value=1e6,
        user_attrs={"ks_config": full, "ks_state": "ok", "ks_evaluated": True}))
    assert space.config_of(params) == space.grid()[0] or sampler == "grid"
    res = tune_case(FAKE, axes, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=3, sampler=sampler, seed=0, measure_n=2,
                                        warm_start=False))
    assert res.key.study_name == name and res.trials.n_complete == 3 and res.trials.n_run_now == 2
    if sampler == "grid":
        assert res.trials.n_cached == 0
    ran = [t.params["BLOCK"] for t in _evaluated(url, name) if "BLOCK" in t.params]
    assert len(ran) == 2 and 16 not in ran or sampler == "tpe"
