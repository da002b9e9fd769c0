"""Background tuning from a capture: an undeclared kernel's miss in the opt-in mode
(KS_AUTOTUNE_FALLBACK=first) sends its call as data with its job; a worker imports the kernel's
module, rebuilds the inputs, tunes every config in its trial child and stores the record, which a
fresh process is then served without a benchmark. A module no worker can import fails its job,
naming the module and the fix."""
from __future__ import annotations

from trusted_records import trusted

import json

import pytest
import torch
import triton
from at_env import child_env, run_user
from fastapi.testclient import TestClient
from svc_helpers import KB, LiveServer, settings_for

from kernelsearch.kernels.capture import Capture, CaptureError, capture_call, rebuild
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.kernels.spec import config_key
from kernelsearch.service.api import create_app
from kernelsearch.service.definitions import register_definition
from kernelsearch.service.worker import Worker

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("isolated_client")]
NAME = "ks_undeclared_user.scale_kernel"
# The modules these tests' jobs name, as an operator allows them (KS_JOB_MODULES).
MODULES = ["ks_undeclared_user", "ks_nowhere_pkg"]
CASE = {"n": 200, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}


def _user(n: int, dtype: str, env: dict) -> dict:
    return run_user("ks_undeclared_user.py", n, dtype, env=env)


def test_a_miss_is_tuned_by_a_worker_from_its_capture_and_served_to_a_fresh_process(
        sqlite_store) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none", job_modules=MODULES)
    with LiveServer(create_app(settings, store=sqlite_store)) as srv:
        # The lookup (and the job it queues) is waited for: the script exits right after. Its
        # request may take all of KS_AUTOTUNE_TIMEOUT_S: a provider bound far below what a
        # request takes on a loaded machine (here: always) must not make the service count as
        # down, nor the fresh process below run the first config.
        env = child_env(KS_SERVICE_URL=srv.url, KS_AUTOTUNE_FALLBACK="first",
                        KS_AUTOTUNE_TIMEOUT_S="60", KS_PROVIDER_TIMEOUT_S="0.001")
        first = _user(200, "float32", env)
        assert first == {"sources": ["first"], "benched": 0, "best": 16}
        (job,) = sqlite_store.list_jobs()
        assert (job.kernel, job.cases, job.sampler, job.n_trials) == (NAME, [CASE], "grid", 3)
        cap = Capture.from_json(job.capture)
        assert [(a.name, a.kind) for a in cap.args] == [("x_ptr", "tensor"), ("y_ptr", "tensor"),
                                                        ("n", "scalar")]
        assert cap.grids == ((13, 1, 1), (7, 1, 1), (4, 1, 1))  # cdiv(200, BLOCK) per config
        worker = Worker(settings, sqlite_store)
        try:
            assert worker.run_one() is True
        finally:
            worker.close()
        done = sqlite_store.get_job(job.id)
        assert done.status == "succeeded", done.error
        (rec,) = sqlite_store.list_records(kernel=NAME)
        assert rec.job_id == job.id and rec.device == INTERPRETER_DEVICE
        assert rec.axes == CASE and len(rec.config_timings) == 3
        assert all(v is not None for v in rec.config_timings.values())
        # A fresh process gets the worker's config with no benchmark.
        second = _user(200, "float32", env)
        assert second == {"sources": ["service"], "benched": 0, "best": rec.config["BLOCK"]}
        assert len(sqlite_store.list_jobs()) == 1  # a served key queues nothing


def test_a_worker_searches_beyond_the_list_after_the_capture_job_when_the_decorator_allows_it(sqlite_store) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none", job_modules=MODULES)
    with LiveServer(create_app(settings, store=sqlite_store)) as srv:
        env = child_env(KS_SERVICE_URL=srv.url, KS_AUTOTUNE_FALLBACK="first",
                        KS_AUTOTUNE_TIMEOUT_S="60", KS_TEST_BEYOND="1")
        assert _user(200, "float32", env)["sources"] == ["first"]
        (job,) = sqlite_store.list_jobs()
        assert job.n_trials == 4 and len(job.capture["grids"]) == 4
        worker = Worker(settings, sqlite_store)
        try:
            assert worker.run_one() is True
        finally:
            worker.close()
        assert sqlite_store.get_job(job.id).status == "succeeded"
        (rec,) = sqlite_store.list_records(kernel=NAME)
        blocks = sorted(json.loads(k)["BLOCK"] for k in rec.config_timings)
        assert blocks == [16, 32, 64]  # the list: the config beyond it is the search job's
        (search,) = [j for j in sqlite_store.list_jobs() if j.id != job.id]
        assert search.kind == "search" and search.capture == job.capture
        worker = Worker(settings, sqlite_store)
        try:
            assert worker.run_one() is True
        finally:
            worker.close()
        assert sqlite_store.get_job(search.id).status == "succeeded"
        (rec,) = sqlite_store.list_records(kernel=NAME)
        blocks = sorted(json.loads(k)["BLOCK"] for k in rec.config_timings)
        assert blocks == [16, 32, 64, 256]
        # Whichever won, a record whose winner is the config beyond the list is served as is.
        from dataclasses import asdict

        from kernelsearch.db.views import RecordIn

        beyond = next(json.loads(k) for k in rec.config_timings if json.loads(k)["BLOCK"] == 256)
        fields = {k: v for k, v in asdict(rec).items() if k in RecordIn.__dataclass_fields__}
        sqlite_store.upsert_best(trusted(RecordIn(**{
            **fields, "config": beyond, "latency_median_us": rec.latency_median_us / 2,
            "latency_min_us": rec.latency_min_us / 2, "latency_max_us": rec.latency_median_us / 2,
            "config_timings": {**rec.config_timings, config_key(beyond): rec.latency_median_us / 2},
            "winner_origin": "search", "gain_vs_list": 2.0, "gain_low": None, "gate_edges": None})))
        # Without the strict gate's evidence an undeclared kernel's searched winner is opt-in
        # (KS_AUTOTUNE_SERVE_SEARCHED): by default the list's best by the record's own timings
        # runs, nothing benchmarked.
        listed_best = min((v, json.loads(k)["BLOCK"]) for k, v in rec.config_timings.items()
                          if v is not None and json.loads(k)["BLOCK"] != 256)[1]
        assert _user(200, "float32", env) == {"sources": ["service"], "benched": 0,
                                              "best": listed_best}
        served = _user(200, "float32", {**env, "KS_AUTOTUNE_SERVE_SEARCHED": "on"})
        assert served == {"sources": ["service"], "benched": 0, "best": 256}


def _capture_doc(n: int = 8) -> dict:
    x, y = torch.randn(n), torch.empty(n)
    return capture_call({"x": x, "y": y, "n": n}, [], [{"B": 4, "num_warps": 1}],
                        lambda meta: (triton.cdiv(meta["n"], meta["B"]),)).as_json()


def test_a_kernel_no_worker_can_import_is_handed_back_then_failed_naming_the_module(
        sqlite_store) -> None:
    doc = {"name": "ks_nowhere_pkg.k", "module": "ks_nowhere_pkg", "qualname": "k",
           "arg_names": ["x", "y", "n", "B"], "key": ["n"], "dtype_args": ["x", "y"],
           "configs": [{"B": 4, "num_warps": 1}], "source_hash": "ab"}
    settings = settings_for(sqlite_store.url, capture_import_tries=2, job_modules=MODULES)
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        assert c.post("/v1/kernels", json=doc).status_code == 201
        got = c.post("/v1/jobs", json={"kernel": doc["name"], "n_trials": 1, "sampler": "grid",
                                       "cases": [{"n": 8, "x.dtype": "float32",
                                                  "y.dtype": "float32"}],
                                       "capture": _capture_doc()})
        assert got.status_code == 202, got.text
        job_id = got.json()["id"]
        assert got.json()["captured"] is True
        worker = Worker(settings, sqlite_store)
        assert worker.run_one() is True
        left = c.get(f"/v1/jobs/{job_id}").json()
        assert left["status"] == "queued" and left["error"] is None  # for a worker that can
        assert worker.run_one() is True
        failed = c.get(f"/v1/jobs/{job_id}").json()
        assert failed["status"] == "failed"
        assert "'ks_nowhere_pkg'" in failed["error"] and "KS_KERNEL_MODULES" in failed["error"]
        assert "install it on the worker host" in failed["error"]


def test_a_job_capture_is_checked_by_the_api(sqlite_store) -> None:
    doc = {"name": "ks_nowhere_pkg.k2", "module": "ks_nowhere_pkg", "qualname": "k2",
           "arg_names": ["x", "y", "n", "B"], "key": ["n"], "dtype_args": ["x", "y"],
           "configs": [{"B": 4, "num_warps": 1}], "source_hash": "ab"}
    case = {"n": 8, "x.dtype": "float32", "y.dtype": "float32"}
    with TestClient(create_app(settings_for(sqlite_store.url, job_modules=MODULES),
                               store=sqlite_store)) as c:
        assert c.post("/v1/kernels", json=doc).status_code == 201

        def submit(kernel: str, cases: list, capture: dict) -> tuple[int, str]:
            r = c.post("/v1/jobs", json={"kernel": kernel, "cases": cases, "n_trials": 1,
                                         "capture": capture})
            return r.status_code, r.json()["detail"]

        bad = _capture_doc()
        bad["args"][0]["dtype"] = "float99"
        assert submit(doc["name"], [case], bad) == (
            422, "capture.args[0].dtype: expected a torch dtype name, got 'float99'")
        assert submit(KB, [{"seq_len": 2}], _capture_doc())[0] == 422  # a declared kernel
        status, detail = submit(doc["name"], [{**case, "n": 9}], _capture_doc())
        assert status == 422 and detail.startswith("cases: a job with a capture")
        two = _capture_doc()
        two["grids"].append([1, 1, 1])
        assert submit(doc["name"], [case], two) == (422, "capture.grids: 2 grids for 1 configs")
        huge = _capture_doc()
        huge["pad"] = "x" * 70_000
        assert c.post("/v1/jobs", json={"kernel": doc["name"], "cases": [case], "n_trials": 1,
                                        "capture": huge}).status_code == 413
    register_definition(doc)  # the registry is per process: leave it as the app left it


def test_capture_round_trip_and_rebuild() -> None:
    idx = torch.tensor([[3, 1], [2, 0]], dtype=torch.int32).t()  # non-contiguous
    big = torch.arange(5000, dtype=torch.int64)
    x = torch.randn(4, 6)[:, ::2]
    cap = capture_call({"x": x, "idx": idx, "big": big, "opt": None, "scale": 0.5, "ACT": "relu"},
                       ["ACT"], [{"B": 2}, {"B": 4}], lambda m: (x.shape[0] // m["B"], 2))
    doc = json.loads(json.dumps(cap.as_json()))
    back = Capture.from_json(doc)
    assert back == cap and back.grids == ((2, 2, 1), (1, 2, 1))
    kinds = {a.name: a.kind for a in back.args}
    assert kinds == {"x": "tensor", "idx": "tensor", "big": "tensor", "opt": "none",
                     "scale": "scalar", "ACT": "constexpr"}
    got = rebuild(back, "cpu", seed=3)
    assert got["x"].shape == x.shape and got["x"].stride() == x.stride() and got["x"].dtype == x.dtype
    assert torch.equal(got["idx"], idx) and got["idx"].stride() == idx.stride()
    assert got["big"].shape == big.shape and int(got["big"].min()) >= 0 and int(got["big"].max()) <= 4999
    assert got["opt"] is None and got["scale"] == 0.5 and got["ACT"] == "relu"
    assert torch.equal(rebuild(back, "cpu", seed=3)["x"], got["x"])  # a seed is one draw


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.pop("grids"), "capture.grids"),
    (lambda d: d.update(version=2), "capture.version"),
    (lambda d: d["args"][0].update(kind="blob"), "capture.args[0].kind"),
    (lambda d: d["args"][0].update(strides=[1, 1]), "capture.args[0].strides"),
    (lambda d: d["args"][0].update(shape=[-1]), "capture.args[0].shape"),
    (lambda d: d["args"][2].update(value=[1]), "capture.args[2].value"),
    (lambda d: d["args"].append(dict(d["args"][0])), "capture.args"),
    (lambda d: d["grids"][0].append(1), "capture.grids[0]"),
])
def test_a_bad_capture_is_refused_naming_the_field(change, field) -> None:
    doc = _capture_doc()
    change(doc)
    with pytest.raises(CaptureError) as err:
        Capture.from_json(doc)
    assert str(err.value).startswith(field + ":"), err.value


def test_what_cannot_travel_is_said() -> None:
    with pytest.raises(CaptureError, match="^x: a object argument cannot be captured"):
        capture_call({"x": object()}, [], [{"B": 1}], (1,))
    with pytest.raises(CaptureError, match="^s: a non-finite float"):
        capture_call({"s": float("inf")}, [], [{"B": 1}], (1,))


def test_a_job_keeps_its_capture_in_either_database(store) -> None:
    doc = _capture_doc()
    plain = store.create_job("ks_cap_k", [{"n": 8}], 1, "grid")
    job, existing = store.queue_job("ks_cap_k", [{"n": 8}], 1, "grid", capture=doc)
    assert not existing and job.id != plain.id  # a capture job is not a plain job's duplicate
    assert job.capture == doc and plain.capture is None
    again, existing = store.queue_job("ks_cap_k", [{"n": 8}], 1, "grid", capture=doc)
    assert existing and again.id == job.id
    claimed = store.claim_job("w1", 60.0)
    assert claimed.id == plain.id and store.claim_job("w1", 60.0).capture == doc
    shown = store.get_job(job.id).as_dict()
    assert shown["captured"] is True and "capture" not in shown


def test_a_capture_the_route_refuses_is_refused_on_the_decorators_fallback_too(
        sqlite_store, monkeypatch, caplog) -> None:
    """With the local store only, a miss's job passes the routes' own acceptance (`accept_job`):
    a call of a module no worker imports is refused here as POST /v1/jobs refuses it (422), not
    queued to fail later on a worker; once the operator allows the module, it is queued, checked
    against the definition the call sends."""
    import ks_undeclared_user as u

    from kernelsearch.backends import BACKENDS

    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.delenv("KS_JOB_MODULES", raising=False)
    for allowed in (False, True):
        if allowed:
            monkeypatch.setenv("KS_JOB_MODULES", "ks_undeclared_user")
            # This process knew an older definition of the name (one more config to search):
            # the call's job is checked against the definition it sends, not that one.
            from kernelsearch.kernels import registry
            from kernelsearch.service.definitions import register_definition

            older = registry.get_kernel(NAME).definition.as_json()
            register_definition({**older, "search_space": [{"BLOCK": 256, "num_warps": 4}]})
        u.scale_kernel.forget()
        BACKENDS.reset()
        u.scale(torch.randn(200))
        BACKENDS.drain(20)
        jobs = sqlite_store.list_jobs()
        if not allowed:
            assert jobs == []
            assert "module 'ks_undeclared_user' is not one this service's workers import" in caplog.text
    (job,) = jobs
    assert job.kernel == NAME and job.capture is not None and job.cases == [CASE]


def test_a_grid_that_reads_a_heuristic_value_is_captured() -> None:
    """A `@triton.heuristics` under the autotuner sets launch keywords the grid reads (FlagGems'
    softmax backward: `grid = lambda meta: (cdiv(M, meta["TILE_M"]),)`); the capture computes them
    per config as Triton does at launch, outermost first."""
    from kernelsearch.kernels.capture import heuristics_of

    @triton.heuristics({"TILE_M": lambda a: 4 * a["BLOCK"]})
    @triton.heuristics({"BLOCK": lambda a: a["BLOCK"] * 2})
    @triton.jit
    def k(x_ptr, M, BLOCK: "triton.language.constexpr", TILE_M: "triton.language.constexpr"):
        pass

    levels = heuristics_of(k)
    assert [list(lv) for lv in levels] == [["TILE_M"], ["BLOCK"]]
    cap = capture_call({"x_ptr": torch.zeros(4), "M": 1000}, ["BLOCK", "TILE_M"],
                       [{"BLOCK": 8}, {"BLOCK": 16}], lambda meta: (triton.cdiv(meta["M"], meta["TILE_M"]),),
                       heuristics=levels)
    assert cap.grids == ((32, 1, 1), (16, 1, 1))  # TILE_M = 4 * BLOCK, then BLOCK doubled
    with pytest.raises(KeyError):
        capture_call({"x_ptr": torch.zeros(4), "M": 1000}, [], [{"BLOCK": 8}],
                     lambda meta: (triton.cdiv(meta["M"], meta["TILE_M"]),))


def test_a_dtype_argument_travels_as_its_key_text() -> None:
    """gemlite passes its input dtype as an argument: a torch or Triton dtype is captured as the
    key's text and rebuilt as itself; a dtype that would not come back is refused by name."""
    import triton.language as tl

    cap = capture_call({"x": torch.zeros(4), "DT": torch.float16, "TL": tl.float16}, ["TL"],
                       [{"B": 1}], (1,))
    assert [(a.name, a.kind, a.value) for a in cap.args[1:]] == [
        ("DT", "dtype", "torch:float16"), ("TL", "dtype", "tl:fp16")]
    back = rebuild(Capture.from_json(json.loads(json.dumps(cap.as_json()))), "cpu")
    assert back["DT"] is torch.float16 and back["TL"] == tl.float16
    doc = cap.as_json()
    doc["args"][1]["value"] = "torch:nonsense"
    with pytest.raises(CaptureError, match=r"^capture.args\[1\].value: a dtype"):
        Capture.from_json(doc)
