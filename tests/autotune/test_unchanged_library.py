"""A library reached unchanged (its module keeps `@triton.autotune`; the user's program swaps
`triton.autotune` for `kernelsearch.autotune`): a worker importing the module as shipped wraps
its plain autotuner as the swap did, tunes the captured call and stores the record a fresh
process is served; a job tunes the configs the kernel's own pruner kept on the call, checked
against the first of them."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import triton
from at_env import child_env, run_user
from svc_helpers import LiveServer, settings_for

import ks_plain_lib as lib
from kernelsearch import identity
from kernelsearch.kernels.capture import (Capture, KernelModuleUnavailable, capture_call,
                                          import_tuner)
from kernelsearch.kernels.configs import canonical
from kernelsearch.service import job_child, search_jobs
from kernelsearch.service.api import create_app
from kernelsearch.tuner import Autotuner
from kernelsearch.service.definitions import register_definition
from kernelsearch.service.worker import Worker

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("isolated_client")]
MODULES = ["ks_plain_lib"]


def _job_through_worker(store, settings, op: str, n: int) -> tuple[dict, object, object]:
    """The user's program misses under KS_AUTOTUNE_FALLBACK=first, a worker runs its job; the
    program's answer, the job, and its record."""
    with LiveServer(create_app(settings, store=store)) as srv:
        env = child_env(KS_SERVICE_URL=srv.url, KS_AUTOTUNE_FALLBACK="first",
                        KS_AUTOTUNE_TIMEOUT_S="60")
        first = run_user("ks_swap_user.py", op, n, env=env)
        (job,) = store.list_jobs()
        worker = Worker(settings, store)
        try:
            assert worker.run_one() is True
        finally:
            worker.close()
        done = store.get_job(job.id)
        assert done.status == "succeeded", done.error
        (rec,) = store.list_records(kernel=job.kernel)
        second = run_user("ks_swap_user.py", op, n, env=env)
    return {"first": first, "second": second}, done, rec


def test_a_plain_triton_autotune_kernel_reached_by_the_swap_is_tuned_by_a_worker(
        sqlite_store) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none", job_modules=MODULES)
    got, job, rec = _job_through_worker(sqlite_store, settings, "triple", 100)
    assert got["first"] == {"sources": ["first"], "benched": 0, "best": 16, "reached_by": "swap"}
    assert job.kernel == "ks_plain_lib.triple_kernel"
    assert sqlite_store.kernel_definitions()[job.kernel]["reached_by"] == "swap"
    assert len(rec.config_timings) == 2 and all(v is not None for v in rec.config_timings.values())
    assert got["second"]["sources"] == ["service"] and got["second"]["benched"] == 0


def test_a_kernel_under_a_librarys_launch_wrapper_is_tuned_by_a_worker(sqlite_store) -> None:
    """FlagGems' shape: a launch wrapper above the autotuner, reached by the swap; the worker's
    job times both configs of the list and a fresh process is served."""
    settings = settings_for(sqlite_store.url, tune_reference="none", job_modules=MODULES)
    got, job, rec = _job_through_worker(sqlite_store, settings, "quarter", 100)
    assert job.kernel == "ks_plain_lib.quarter_kernel"
    assert len(rec.config_timings) == 2 and all(v is not None for v in rec.config_timings.values())
    assert got["second"]["sources"] == ["service"] and got["second"]["benched"] == 0


def test_a_captured_call_is_tuned_over_the_configs_its_pruner_kept(sqlite_store) -> None:
    """n=200: the pruner keeps BLOCK 256 and 512 (one program covers the call); the unpruned
    first config (16) writes 16 of the 200 outputs. The job tunes 256 and 512, both right
    against 256, and the record serves one of them."""
    settings = settings_for(sqlite_store.url, tune_reference="none", job_modules=MODULES)
    got, job, rec = _job_through_worker(sqlite_store, settings, "plus_one", 200)
    assert got["first"]["best"] == 256  # the first config after pruning, as Triton runs it
    assert Capture.from_json(job.capture).ran == (2, 3)
    blocks = {json.loads(k)["BLOCK"]: v for k, v in rec.config_timings.items()}
    assert set(blocks) == {256, 512} and all(v is not None for v in blocks.values())
    assert rec.config["BLOCK"] in (256, 512)
    assert got["second"]["sources"] == ["service"] and got["second"]["benched"] == 0


def test_the_worker_wraps_an_autotuner_under_heuristics_and_refuses_other_code() -> None:
    """`@triton.heuristics` above `@triton.autotune`: the worker finds the plain autotuner under
    the heuristics and wraps it (the call's capture holds the heuristics' values). A module
    whose kernel is other code than the caller's is refused, saying so."""
    x = torch.randn(64)
    und = identity.undeclared_kernel(lib.halve_kernel.fn, {"x_ptr": x, "y_ptr": x, "n": 64})
    assert und.definition.reached_by.value == "triton_cache"
    tuner = import_tuner(und.definition)
    assert isinstance(tuner, Autotuner) and tuner.fn is lib.halve_kernel.fn.fn
    y = torch.empty_like(x)
    with tuner.using({"BLOCK": 32, "num_warps": 1}):
        tuner[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](x, y, 64, EVEN=True)
    torch.testing.assert_close(y, x / 2)
    with pytest.raises(KernelModuleUnavailable, match="other code than the caller's"):
        import_tuner(replace(und.definition, source_hash="0" * 16))


def test_the_worker_finds_the_autotuner_under_a_librarys_launch_wrapper() -> None:
    """FlagGems' `@libentry()` above `@triton.autotune`: the worker wraps the autotuner under it,
    so each trial launches its own config (through the wrapper, the first config's kernel would
    be launched again, or the shipped autotuner would benchmark its own list)."""
    x = torch.randn(64)
    und = identity.undeclared_kernel(lib.quarter_kernel.fn, {"x_ptr": x, "y_ptr": x, "n": 64})
    tuner = import_tuner(und.definition)
    assert isinstance(tuner, Autotuner) and tuner.fn is lib.quarter_kernel.fn.fn
    y = torch.empty_like(x)
    with tuner.using({"BLOCK": 32, "num_warps": 1}):
        tuner[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](x, y, 64)
    torch.testing.assert_close(y, x / 4)


def test_a_search_job_runs_on_a_library_reached_unchanged(sqlite_store, monkeypatch) -> None:
    """`kernelsearch search --from-captures` of a kernel whose module keeps `@triton.autotune`:
    the search job's child wraps it as the worker's trial child does, and stores a record."""
    x = torch.randn(100)
    named = {"x_ptr": x, "y_ptr": torch.empty_like(x), "n": 100}
    und = identity.undeclared_kernel(lib.triple_kernel, named)
    beyond = [canonical(triton.Config({"BLOCK": 64}, num_warps=1))]
    defn = {**und.definition.as_json(), "search_space": beyond, "reached_by": "swap"}
    cap = capture_call(named, ["BLOCK"], [*defn["configs"], *beyond],
                       lambda meta: (triton.cdiv(100, meta["BLOCK"]),)).as_json()
    case = {"n": 100, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
    settings = settings_for(sqlite_store.url, job_modules=MODULES, search_trials=2, search_seconds=60)
    sqlite_store.save_definition(und.name, defn)
    register_definition(defn, sqlite_store)
    first, _ = sqlite_store.queue_job(und.name, [case], 3, "grid", None, None, cap)
    sqlite_store.cancel_job(first.id)
    (queued, _), = search_jobs.queue_searches(sqlite_store, settings)
    monkeypatch.setattr(job_child, "run_in_child", lambda fn, *a, stop=None, limit_s=None: fn(*a))
    worker = Worker(settings, sqlite_store)
    try:
        assert worker.run_one() is True
    finally:
        worker.close()
    done = sqlite_store.get_job(queued.id)
    assert done.status == "succeeded", done.error
    (rec,) = sqlite_store.list_records(kernel=und.name)
    assert len(rec.config_timings) >= 2 and rec.winner_origin in ("list", "search")
