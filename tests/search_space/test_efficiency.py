"""The efficiency experiment's pieces: the 3% criterion and a replay over a measured grid."""
from __future__ import annotations

import json

import optuna

from kernelsearch_tools.efficiency import TableRunner, _grid_table, best_so_far, trials_to_within
from kernelsearch.search_space.tuner import TuneOptions, tune_case

from ss_helpers import FAKE, fake_space


def test_trials_to_within():
    assert trials_to_within([None, 10.0, 5.1, 5.0], 5.0) == 3
    assert trials_to_within([None, 10.0, 5.2, 5.0], 5.0) == 4
    assert trials_to_within([None, 10.0], 5.0) is None
    assert best_so_far([None, 3.0, 4.0, 2.0]) == [None, 3.0, 3.0, 2.0]


def test_replay_answers_from_the_grid_without_running(ss_store, runner):
    store, url = ss_store
    space = fake_space(modes=("ok", "wrong"), blocks=(16, 32, 64))
    grid = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                     options=TuneOptions(n_trials=space.size(), sampler="grid", seed=0, measure_n=2,
                                         name="g"))
    table = _grid_table(url, "g")
    assert len(table) == 6 and grid.trials.n_complete + grid.trials.n_failed == 6
    tab = TableRunner(table, space, runner.device_info, runner.versions)
    rep = tune_case(FAKE, {"n": 24}, store=store, runner=tab, space=space,
                    storage=optuna.storages.InMemoryStorage(), options=TuneOptions(n_trials=6,
                                                                                   sampler="random", seed=1,
                                                                                   measure_n=2, name="r",
                                                                                   write_record=False,
                                                                                   summaries=False))
    assert rep.best.latency_us == grid.best.latency_us and rep.trials.n_failed == 3
    assert rep.times.compile_s == 0 and rep.best.record_id is None
    assert trials_to_within(rep.trials.history, grid.best.latency_us) is not None
    assert all(json.loads(k)["MODE"] in ("ok", "wrong") for k in table)
