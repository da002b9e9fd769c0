"""A tuning run leaves what a complete records export needs: the study's trials (with their job)
and the references' latencies, so the shipped records carry history and speedups."""
from __future__ import annotations

import json

from kernelsearch.search_space.tuner import TuneOptions, tune_case

from ss_helpers import FAKE, fake_space


def test_tuning_run_fills_a_complete_export(ss_store, runner):
    store, url = ss_store
    space = fake_space(modes=("ok", "compile_error"), blocks=(16, 32))
    res = tune_case(FAKE, {"n": 24}, store=store, storage=url, runner=runner, space=space,
                    options=TuneOptions(n_trials=4, sampler="grid", seed=0, measure_n=2, job_id=41))
    assert res.best.record_id is not None and res.trials.n_failed >= 1
    (rec,) = store.list_records(FAKE, res.key.device)
    # auto: eager under the interpreter, timed as the trials are, so the speedup is comparable.
    assert rec.eager_latency_us is not None and rec.eager_latency_us > 0
    assert rec.speedup_eager == rec.eager_latency_us / rec.latency_median_us
    assert rec.compile_latency_us is None and rec.speedup_compile is None
    assert {t["job_id"] for t in store.trial_summaries(FAKE, res.key.device, res.key.axes)} == {41}
    (entry,) = json.loads(json.dumps(store.export_records(kernel=FAKE)))["records"]
    assert len(entry["trials"]) == rec.n_trials == res.trials.n_complete + res.trials.n_failed
    failed = [t for t in entry["trials"] if t["state"] == "fail"]
    assert len(failed) == rec.n_failed and all(t["failure_kind"] for t in failed)
    assert entry["speedup_eager"] == rec.speedup_eager


def test_reference_none_measures_nothing(ss_store, runner):
    store, url = ss_store
    res = tune_case(FAKE, {"n": 16}, store=store, storage=url, runner=runner,
                    space=fake_space(modes=("ok",), blocks=(16,)), options=TuneOptions(n_trials=1,
                                                                                       sampler="grid", seed=0,
                                                                                       measure_n=2,
                                                                                       reference="none"))
    (rec,) = store.list_records(FAKE, res.key.device)
    assert rec.eager_latency_us is None and rec.speedup_eager is None
