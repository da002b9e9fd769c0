"""Search jobs (issue 35): `kernelsearch search --from-captures` queues one per key a program's
captures met; a worker runs it (the per-key study in the store, the strict gate, the re-measure)
and stores a record that says where its winner came from. Under the interpreter the timings
mean nothing: what is asserted is the mechanics, and the record's consistency with them."""
from __future__ import annotations

import json
import math

import optuna
import pytest
import torch
import triton
from svc_helpers import settings_for, spy_cuda_probes
from typer.testing import CliRunner

import ks_undeclared_user
from kernelsearch.kernels.capture import capture_call, jit_function_of
from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.spec import source_hash_of
from kernelsearch.search_space.acceptance import RecordRejected
from kernelsearch.search_space.key_search import A_FAILED, A_LISTED, A_REFUSED
from kernelsearch.service import job_child, search_jobs
from kernelsearch.service.cli import app
from kernelsearch.service.definitions import register_definition
from kernelsearch.service.worker import Worker

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("isolated_client")]
NAME = "ks_undeclared_user.scale_kernel"
CASE = {"n": 200, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
BEYOND = [{"BLOCK": 128, "num_warps": 4, "num_stages": 3, "num_ctas": 1},
          {"BLOCK": 8, "num_warps": 2, "num_stages": 1, "num_ctas": 1}]


def _definition() -> dict:
    tuner = ks_undeclared_user.scale_kernel
    return {"name": NAME, "module": "ks_undeclared_user", "qualname": "scale_kernel",
            "arg_names": list(tuner.arg_names), "key": ["n"], "dtype_args": ["x_ptr", "y_ptr"],
            "configs": [canonical(c) for c in tuner.configs], "search_space": BEYOND,
            "source_hash": source_hash_of([jit_function_of(tuner)])}


def _capture() -> dict:
    x, y = torch.randn(200), torch.empty(200)
    configs = [*_definition()["configs"], *BEYOND]
    return capture_call({"x_ptr": x, "y_ptr": y, "n": 200}, ["BLOCK"], configs,
                        lambda meta: (triton.cdiv(200, meta["BLOCK"]),)).as_json()


def _in_process(fn, *args, stop=None, limit_s=None):
    return fn(*args)


def _run_search(store, settings, queued, monkeypatch):
    """A worker runs the queued search job in this process; the job, succeeded."""
    monkeypatch.setattr(job_child, "run_in_child", _in_process)
    worker = Worker(settings, store)
    try:
        assert worker.run_one() is True
    finally:
        worker.close()
    done = store.get_job(queued.id)
    assert done.status == "succeeded", done.error
    return done


def test_a_search_job_per_captured_key_stores_a_record_saying_where_its_winner_came_from(
        sqlite_store, monkeypatch) -> None:
    settings = settings_for(sqlite_store.url, job_modules=["ks_undeclared_user"],
                            search_trials=2, search_seconds=60)
    sqlite_store.save_definition(NAME, _definition())
    register_definition(_definition(), sqlite_store)
    first, _ = sqlite_store.queue_job(NAME, [CASE], 5, "grid", None, None, _capture())
    sqlite_store.cancel_job(first.id)  # only the stored call matters here
    (queued, new), = search_jobs.queue_searches(sqlite_store, settings)
    assert new and queued.sampler == search_jobs.SEARCH and queued.n_trials == 2
    assert search_jobs.queue_searches(sqlite_store, settings)[0] == (queued, False)
    done = _run_search(sqlite_store, settings, queued, monkeypatch)
    (rec,) = sqlite_store.list_records(kernel=NAME)
    listed = {canonical_key(c) for c in _definition()["configs"]}
    assert set(rec.config_timings) >= listed
    if rec.winner_origin == "search":
        assert rec.gain_vs_list > 1 and canonical_key(rec.config) not in listed
    else:
        assert rec.gain_vs_list in (None, 1.0) and set(rec.config_timings) == listed
    assert rec.latency_median_us == min(t for t in rec.config_timings.values() if t is not None)
    study = optuna.load_study(study_name=search_jobs.study_of(NAME, CASE, rec.device),
                              storage=sqlite_store.url)
    ran = [t for t in study.trials if not t.user_attrs.get(A_LISTED)
           and t.state == optuna.trial.TrialState.COMPLETE]
    assert ran and done.best["cases"][0]["trials_done"] == 2  # both configs beyond the list
    from fastapi.testclient import TestClient

    from kernelsearch.service.api import create_app
    from kernelsearch.service.dashboard import gain_label

    with TestClient(create_app(settings, store=sqlite_store)) as c:
        page = c.get("/").text
    assert "vs the list's best" in page and gain_label(rec.as_dict()) in page
    assert gain_label({"winner_origin": "search", "gain_vs_list": 1.284}) == "1.28× (searched)"
    assert gain_label({"winner_origin": "list", "gain_vs_list": None}) == "list"


def test_a_capture_job_tunes_the_calls_list_and_queues_the_search_beyond_it(sqlite_store) -> None:
    """A capture job runs the list as triton.autotune would (a few configs, minutes on a GPU),
    not the search space the kernel sent with it: configs beyond the list are a search job's,
    queued after it, whose winner the strict gate checks before it is served."""
    from kernelsearch.db.statuses import JobKind

    settings = settings_for(sqlite_store.url, job_modules=["ks_undeclared_user"],
                            search_trials=2, search_seconds=60)
    sqlite_store.save_definition(NAME, _definition())
    register_definition(_definition(), sqlite_store)
    listed = _definition()["configs"]
    job, _ = sqlite_store.queue_job(NAME, [CASE], len(listed) + len(BEYOND), "grid", None, None,
                                    _capture())
    assert job.kind == JobKind.CAPTURE
    worker = Worker(settings, sqlite_store)
    try:
        assert worker.run_one() is True
    finally:
        worker.close()
    done = sqlite_store.get_job(job.id)
    assert done.status == "succeeded", done.error
    (rec,) = sqlite_store.list_records(kernel=NAME)
    assert set(rec.config_timings) == {canonical_key(c) for c in listed}
    assert rec.winner_origin == "list"
    searches = [j for j in sqlite_store.list_jobs() if j.kind == JobKind.SEARCH]
    assert [(j.kernel, j.cases, j.capture) for j in searches] == [(NAME, [CASE], job.capture)]


def test_a_searched_record_without_a_gain_is_refused(sqlite_store) -> None:
    from kernelsearch.kernels import get_kernel
    from kernelsearch.kernels.device import versions

    register_definition(_definition(), sqlite_store)
    listed, beyond = canonical_key(_definition()["configs"][0]), canonical_key(BEYOND[1])
    out = {"timings": {listed: 2.0, beyond: 1.0}, "listed": [listed], "winner": beyond,
           "winner_origin": "search", "gain": 0.9, "configs": {beyond: BEYOND[1]},
           "device": "cpu (triton interpreter)", "timing_method": "interpreter-wallclock",
           "versions": versions()}
    with pytest.raises(RecordRejected) as got:
        search_jobs.search_record(get_kernel(NAME), CASE, out, study_name="s", job_id=None)
    assert got.value.field == "gain_vs_list"


def test_search_from_captures_cli(sqlite_store, monkeypatch) -> None:
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_SEARCH_TRIALS", "7")
    sqlite_store.save_definition(NAME, _definition())
    register_definition(_definition(), sqlite_store)
    runner = CliRunner()
    got = runner.invoke(app, ["search", "--from-captures", "--kernel", NAME])
    assert got.exit_code == 2 and "no stored call" in got.output
    got = runner.invoke(app, ["search", "--from-captures", "--kernel", "nope.k"])
    assert got.exit_code == 2 and "'nope.k' is no undeclared kernel" in got.output and NAME in got.output
    sqlite_store.queue_job(NAME, [CASE], 5, "grid", None, None, _capture())
    got = runner.invoke(app, ["search", "--from-captures", "--json"])
    assert got.exit_code == 0, got.output
    (row,) = json.loads(got.output)
    assert row["kernel"] == NAME and row["n_trials"] == 7 and row["new"] is True
    got = runner.invoke(app, ["search"])
    assert got.exit_code == 2 and "--from-captures" in got.output
    assert not math.isnan(0.0)


def test_search_route_queues_a_job_per_captured_key(sqlite_store) -> None:
    from fastapi.testclient import TestClient

    from kernelsearch.service.api import create_app

    settings = settings_for(sqlite_store.url, search_trials=5, job_modules=["ks_undeclared_user"])
    sqlite_store.save_definition(NAME, _definition())
    register_definition(_definition(), sqlite_store)
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        assert c.post("/v1/search", json={"kernel": NAME}).status_code == 422  # no stored call
        assert c.post("/v1/search", json={"kernel": "nope.k"}).status_code == 404
        assert c.post("/v1/search", json={"kernel": 3}).status_code == 422
        sqlite_store.queue_job(NAME, [CASE], 5, "grid", None, None, _capture())
        got = c.post("/v1/search", json={})
        assert got.status_code == 202
        (job,) = got.json()["jobs"]
        assert (job["kernel"], job["sampler"], job["n_trials"], job["existing"]) == (
            NAME, "search", 5, False)
        assert c.post("/v1/search", json={}).json()["jobs"][0]["existing"] is True


def test_a_searched_winner_is_served_by_default_for_declared_kernels_only(monkeypatch) -> None:
    from kernelsearch.search_policy import search_space_configs, serve_searched

    assert serve_searched(declared=True) and not serve_searched(declared=False)
    monkeypatch.setenv("KS_AUTOTUNE_SERVE_SEARCHED", "on")
    assert serve_searched(declared=False)
    monkeypatch.setenv("KS_AUTOTUNE_SERVE_SEARCHED", "off")
    assert not serve_searched(declared=True)
    listed = ks_undeclared_user.CONFIGS
    derived = search_space_configs(listed, "derived", cap=5)
    assert len(derived) == 5 and all(canonical(c) not in [canonical(x) for x in listed] for c in derived)
    assert [canonical(c) for c in derived] == [canonical(c) for c in search_space_configs(listed, "derived", cap=5)]
    with pytest.raises(ValueError, match="search_space"):
        search_space_configs(listed, "wide")


def test_a_search_job_runs_candidates_as_the_kernels_pruner_makes_them_and_is_served(
        sqlite_store, monkeypatch) -> None:
    """gemlite's case: the pruner makes configs with a constexpr (EVEN) no candidate sets. Each
    candidate runs as the pruner makes it on the captured call (one it drops fails, two it
    merges are one config), and the record, keyed by what ran, is served to the decorator."""
    import ks_pruned_user as u

    from kernelsearch.backends import BACKENDS

    tuner, name = u.fitted_square_kernel, "ks_pruned_user.fitted_square_kernel"
    beyond = [canonical(c) for c in u.BEYOND]
    defn = {"name": name, "module": "ks_pruned_user", "qualname": "fitted_square_kernel",
            "arg_names": list(tuner.arg_names), "key": ["n"], "dtype_args": ["x_ptr", "y_ptr"],
            "configs": [canonical(c) for c in tuner.configs], "search_space": beyond,
            "source_hash": source_hash_of([jit_function_of(tuner)])}
    x, y = torch.randn(96), torch.empty(96)
    capture = capture_call({"x_ptr": x, "y_ptr": y, "n": 96}, ["BLOCK"],
                           [*defn["configs"], *beyond],
                           lambda meta: (triton.cdiv(96, meta["BLOCK"]),)).as_json()
    case = {"n": 96, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
    settings = settings_for(sqlite_store.url, job_modules=["ks_pruned_user"], search_trials=3,
                            search_seconds=60)
    sqlite_store.save_definition(name, defn)
    register_definition(defn, sqlite_store)
    first, _ = sqlite_store.queue_job(name, [case], 5, "grid", None, None, capture)
    sqlite_store.cancel_job(first.id)
    (queued, _), = search_jobs.queue_searches(sqlite_store, settings)
    _run_search(sqlite_store, settings, queued, monkeypatch)
    (rec,) = sqlite_store.list_records(kernel=name)
    made = {(json.loads(k)["BLOCK"], json.loads(k)["num_warps"], json.loads(k)["EVEN"]): t
            for k, t in rec.config_timings.items() if "EVEN" in json.loads(k)}
    assert {(16, 1, True), (128, 1, False)} <= set(made) and "EVEN" in rec.config
    assert all(t is not None for t in made.values())
    study = optuna.load_study(study_name=search_jobs.study_of(name, case, rec.device),
                              storage=sqlite_store.url)
    value = {json.loads(t.user_attrs["ks_config"])["BLOCK"]: (t.state, t.value, t.user_attrs)
             for t in study.trials}
    assert value[1024][1] == value[512][1]  # the pruner runs both as BLOCK 128: one timing
    assert "pruner drops" in value[64][2][A_FAILED]  # 8 warps: a failed trial
    assert value[256][0] == optuna.trial.TrialState.COMPLETE  # ran as (128, 2 warps, EVEN)
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_SERVE_SEARCHED", "on")
    for searched in (False, True):
        if searched:  # a searched winner, as the pruner ran it, is served too
            from dataclasses import asdict

            from trusted_records import trusted

            from kernelsearch.db.views import RecordIn

            win = {"BLOCK": 128, "EVEN": False, "num_warps": 2, "num_stages": 3, "num_ctas": 1}
            t = rec.latency_median_us / 2
            fields = {k: v for k, v in asdict(rec).items() if k in RecordIn.__dataclass_fields__}
            sqlite_store.upsert_best(trusted(RecordIn(**{
                **fields, "config": win, "latency_median_us": t, "latency_min_us": t,
                "latency_max_us": t, "config_timings": {**rec.config_timings, canonical_key(win): t},
                "winner_origin": "search", "gain_vs_list": 2.0})))
            (rec,) = sqlite_store.list_records(kernel=name)
        tuner.forget()
        BACKENDS.reset()
        x = torch.randn(96)
        assert torch.equal(u.square(x), x * x)
        BACKENDS.drain(20)
        assert [s.value for s in tuner.sources.values()] == ["store"]  # nothing benchmarked here
        assert canonical_key(tuner.best_config) == canonical_key(rec.config)


def test_a_search_job_refuses_a_config_wrong_on_a_larger_call_sharing_the_key(
        sqlite_store, monkeypatch) -> None:
    """The strict gate's edges: the config beyond the list writes the first 128 elements only,
    right on the searched call (100 elements) and wrong on a stored call of 300 that shares the
    key; the worker's search job runs it on that edge too, refuses it for good, and serves the
    list."""
    import ks_edge_user as u

    tuner, name = u.capped_scale_kernel, "ks_edge_user.capped_scale_kernel"
    beyond = [canonical(c) for c in u.BEYOND]
    defn = {"name": name, "module": "ks_edge_user", "qualname": "capped_scale_kernel",
            "arg_names": list(tuner.arg_names), "key": ["s"], "dtype_args": ["x_ptr", "y_ptr"],
            "configs": [canonical(c) for c in tuner.configs], "search_space": beyond,
            "source_hash": source_hash_of([jit_function_of(tuner)])}

    def call(n: int) -> dict:
        return capture_call({"x_ptr": torch.randn(n), "y_ptr": torch.empty(n), "n": n, "s": 2},
                            ["BLOCK", "LIMIT"], [*defn["configs"], *beyond],
                            lambda meta: (triton.cdiv(n, meta["BLOCK"]),)).as_json()

    case = {"s": 2, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
    settings = settings_for(sqlite_store.url, job_modules=["ks_edge_user"], search_trials=1,
                            search_seconds=60)
    sqlite_store.save_definition(name, defn)
    register_definition(defn, sqlite_store)
    for n in (300, 100):  # the newest stored call is the one searched: 100; 300 is its edge
        job, _ = sqlite_store.queue_job(name, [case], 5, "grid", None, None, call(n))
        sqlite_store.cancel_job(job.id)
    (queued, _), = search_jobs.queue_searches(sqlite_store, settings)
    assert queued.capture["args"][2]["value"] == 100
    done = _run_search(sqlite_store, settings, queued, monkeypatch)
    assert done.best["cases"][0]["refused"] == 1
    (rec,) = sqlite_store.list_records(kernel=name)
    assert rec.winner_origin == "list" and canonical_key(rec.config) == canonical_key(defn["configs"][0])
    study = optuna.load_study(study_name=search_jobs.study_of(name, case, rec.device),
                              storage=sqlite_store.url)
    (why,) = study.user_attrs[A_REFUSED].values()
    assert why.startswith("edge call")  # every draw of the captured call passed


def test_a_key_tuned_here_keeps_its_call_so_the_whole_program_search_has_it(
        sqlite_store, monkeypatch) -> None:
    """The default policy tunes a miss here and queues no job, so no job carries its call: the
    call is kept with the shared record (`accept_capture`, as a job's capture is checked), and
    `kernelsearch search --from-captures` queues the key's search on it. A module the workers
    do not trust keeps nothing."""
    from kernelsearch.backends import BACKENDS

    u = ks_undeclared_user
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "tune")
    for trusted_module in (False, True):
        if trusted_module:
            monkeypatch.setenv("KS_JOB_MODULES", "ks_undeclared_user")
        else:
            monkeypatch.delenv("KS_JOB_MODULES", raising=False)
        u.scale_kernel.forget()
        BACKENDS.reset()
        u.scale(torch.randn(200 + trusted_module))
        BACKENDS.drain(20)
        if not trusted_module:
            assert sqlite_store.kernel_captures(NAME) == []
    assert sqlite_store.list_jobs() == []  # tuned here: no job
    rec = {json.dumps(r.axes, sort_keys=True): r for r in sqlite_store.list_records(kernel=NAME)}
    ((axes, cap),) = sqlite_store.kernel_captures(NAME)
    assert axes == {**CASE, "n": 201} and json.dumps(axes, sort_keys=True) in rec
    settings = settings_for(sqlite_store.url, job_modules=["ks_undeclared_user"])
    ((job, new),) = search_jobs.queue_searches(sqlite_store, settings)
    assert new and job.capture == cap and job.cases == [axes]


def test_captures_route_keeps_a_checked_call_once(sqlite_store) -> None:
    """POST /v1/captures checks a call as a job's capture is checked: 404 for an unknown kernel,
    422 for a declared kernel's, a module the workers do not trust, or a call that does not fit
    the definition, each naming it; 201 keeps it once (`new`), and the search route queues on it."""
    from fastapi.testclient import TestClient

    from kernelsearch.service.api import create_app

    sqlite_store.save_definition(NAME, _definition())
    register_definition(_definition(), sqlite_store)
    cap = _capture()
    for modules, status, said in (([], 422, "not one this service's workers import"),
                                  (["ks_undeclared_user"], 201, None)):
        settings = settings_for(sqlite_store.url, job_modules=modules)
        with TestClient(create_app(settings, store=sqlite_store)) as c:
            got = c.post("/v1/captures", json={"kernel": NAME, "capture": cap})
            assert got.status_code == status, got.text
            if said:
                assert said in got.json()["detail"]
                continue
            assert got.json() == {"kernel": NAME, "case": CASE, "new": True}
            assert c.post("/v1/captures", json={"kernel": NAME, "capture": cap}).json()["new"] is False
            assert c.post("/v1/captures", json={"kernel": "nope.k", "capture": cap}).status_code == 404
            got = c.post("/v1/captures", json={"kernel": "vision_rope_generation_bwd", "capture": cap})
            assert got.status_code == 422 and "declared kernel" in got.json()["detail"]
            bad = {**cap, "grids": cap["grids"][:1]}
            got = c.post("/v1/captures", json={"kernel": NAME, "capture": bad})
            assert got.status_code == 422 and "capture.grids" in got.json()["detail"]
            assert c.post("/v1/captures", json={"kernel": NAME}).status_code == 422
            (job,) = c.post("/v1/search", json={"kernel": NAME}).json()["jobs"]
            assert job["cases"] == [CASE]
    assert sqlite_store.kernel_captures(NAME) == [(CASE, cap)]


def test_the_worker_running_a_search_job_never_probes_the_gpu_itself(sqlite_store, monkeypatch) -> None:
    """The device is the trial child's report: a worker that probed CUDA would hold a context
    (device memory) and poison whatever it forks. Its child's calls (here in process) may probe."""
    settings = settings_for(sqlite_store.url, job_modules=["ks_undeclared_user"],
                            search_trials=1, search_seconds=60)
    sqlite_store.save_definition(NAME, _definition())
    register_definition(_definition(), sqlite_store)
    first, _ = sqlite_store.queue_job(NAME, [CASE], 5, "grid", None, None, _capture())
    sqlite_store.cancel_job(first.id)
    (queued, _), = search_jobs.queue_searches(sqlite_store, settings)
    in_child = [False]
    probes = spy_cuda_probes(monkeypatch, counting=lambda: not in_child[0])

    def child(fn, *args, stop=None, limit_s=None):
        in_child[0] = True
        try:
            return fn(*args)
        finally:
            in_child[0] = False

    monkeypatch.setattr(job_child, "run_in_child", child)
    worker = Worker(settings, sqlite_store)
    try:
        assert worker.run_one() is True
    finally:
        worker.close()
    assert sqlite_store.get_job(queued.id).status == "succeeded"
    assert probes == []
