"""Issue 33 items 1-3: a job that kills what runs it fails alone, workers import only what their
operator trusts, and a capture is checked against itself and the service's bounds at submit.

Poison modules (tests/service/ks_poison_*.py) exit or crash on import: the worker imports them in
its trial child only, so the job fails naming the module and both workers run the next job."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from svc_helpers import settings_for

from kernelsearch.db.statuses import JobStatus
from kernelsearch.db.store import Store
from kernelsearch.search_space.runner import TrialRunner
from kernelsearch.service.api import create_app
from kernelsearch.service.worker import Worker

pytestmark = pytest.mark.timeout(300)
POISON = ["ks_poison_exit", "ks_poison_crash"]
GOOD = "ks_good_scale"
CASE = {"n": 8, "x.dtype": "float32", "y.dtype": "float32"}


def definition(module: str, name: str | None = None) -> dict[str, Any]:
    return {"name": name or f"{module}.k", "module": module, "qualname": "k",
            "arg_names": ["x", "y", "n", "B"], "key": ["n"], "dtype_args": ["x", "y"],
            "configs": [{"B": 4, "num_warps": 1}], "source_hash": "ab"}


def tensor(name: str, n: int = 8, dtype: str = "float32", **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": "tensor", "shape": [n], "strides": [1], "dtype": dtype, **kw}


def capture(n: int = 8, grid: int = 2, **over: Any) -> dict[str, Any]:
    """A call of definition()'s kernel on `n` elements (x, y of 8 float32 by default)."""
    doc = {"version": 1, "args": [tensor("x"), tensor("y"), {"name": "n", "kind": "scalar", "value": n}],
           "grids": [[grid, 1, 1]]}
    doc.update(over)
    return doc


def job_body(module: str, cap: dict[str, Any] | None = None, n: int = 8) -> dict[str, Any]:
    return {"kernel": f"{module}.k", "n_trials": 1, "sampler": "grid",
            "cases": [{**CASE, "n": n}], "capture": cap or capture(n)}


@pytest.fixture(scope="module")
def runners() -> Iterator[tuple[TrialRunner, TrialRunner]]:
    """Two workers' trial children, kept for the module (each start costs seconds)."""
    a, b = TrialRunner(trial_timeout_s=120), TrialRunner(trial_timeout_s=120)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _submit_good(c: TestClient, kernel: str = "scale_kernel") -> int:
    """A capture job of a ks_good_scale kernel on 16 elements, as its decorator sends it."""
    import torch

    import ks_good_scale
    from kernelsearch.kernels.capture import capture_call
    from kernelsearch.identity import undeclared_kernel

    named = {"x_ptr": torch.randn(16), "y_ptr": torch.empty(16), "n": 16}
    und = undeclared_kernel(getattr(ks_good_scale, kernel), named)
    cap = capture_call(named, [], [{"BLOCK": 16, "num_warps": 1}], (1,))
    assert c.post("/v1/kernels", json=und.definition.as_json()).status_code == 201
    got = c.post("/v1/jobs", json={"kernel": und.name, "n_trials": 1, "sampler": "grid",
                                   "cases": [cap.case_axes(und.definition)], "capture": cap.as_json()})
    assert got.status_code == 202, got.text
    return int(got.json()["id"])


def _submit(c: TestClient, module: str) -> int:
    assert c.post("/v1/kernels", json=definition(module)).status_code == 201
    got = c.post("/v1/jobs", json=job_body(module))
    assert got.status_code == 202, got.text
    return int(got.json()["id"])


def test_a_poison_module_job_fails_alone_and_both_workers_run_the_next_job(
        store: Store, runners: tuple[TrialRunner, TrialRunner]) -> None:
    """Issue 33.1, on each backend: the module exits on import (SystemExit, on SQLite) or crashes
    its importer (SIGSEGV, on PostgreSQL); the job fails on its first claim (within
    KS_JOB_MAX_CLAIMS) naming the module, both workers live on, and the next job succeeds."""
    module, how = (("ks_poison_exit", "raised SystemExit: 3 on import") if store.url.startswith("sqlite")
                   else ("ks_poison_crash", "it was killed by SIGSEGV"))
    settings = settings_for(store.url, tune_reference="none", job_modules=[*POISON, GOOD])
    with TestClient(create_app(settings, store=store)) as c:
        bad = _submit(c, module)
        good = _submit_good(c)
    a = Worker(settings, store, runner=runners[0], owner="worker-a")
    b = Worker(settings, store, runner=runners[1], owner="worker-b")
    assert a.run_one() is True  # returns: the worker lives on
    failed = store.get_job(bad)
    assert failed.status == JobStatus.FAILED and failed.error is not None
    assert failed.error.startswith(f"kernel module {module!r} ") and how in failed.error
    assert "the worker lives on" in failed.error
    assert 1 <= failed.attempts <= settings.job_max_claims
    assert b.run_one() is True
    done = store.get_job(good)
    assert done.status == JobStatus.SUCCEEDED and done.owner == "worker-b", done.error
    assert a.run_one() is False and b.run_one() is False  # both poll on; nothing left behind


def test_workers_import_only_trusted_modules(sqlite_store: Store) -> None:
    """Issue 33.2: a job naming a module outside KS_JOB_MODULES / KS_KERNEL_MODULES / the
    installed plugins, or any package's __main__, is refused at submit naming the setting; a
    worker fails such a job queued before the rule with the same message, importing nothing."""
    settings = settings_for(sqlite_store.url, job_modules=["ks_trusted"])
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        for module in ["unittest.__main__", "venv.__main__", "os", "ks_trusted_not"]:
            assert c.post("/v1/kernels", json=definition(module)).status_code == 201
            got = c.post("/v1/jobs", json=job_body(module))
            assert got.status_code == 422, got.text
            assert got.json()["detail"].startswith(f"kernel: module {module!r} is not one this "
                                                   f"service's workers import")
            assert "KS_JOB_MODULES" in got.json()["detail"]
        assert c.post("/v1/kernels", json=definition("ks_trusted.sub")).status_code == 201
        allowed = c.post("/v1/jobs", json=job_body("ks_trusted.sub"))
        assert allowed.status_code == 202
        sqlite_store.cancel_job(allowed.json()["id"])
    # Queued before the rule (straight into the store): the worker refuses it before importing.
    sqlite_store.save_definition("unittest.__main__.k", definition("unittest.__main__"))
    queued = sqlite_store.create_job("unittest.__main__.k", [CASE], 1, "grid", capture=capture())
    worker = Worker(settings, sqlite_store, owner="w")
    try:
        assert worker.run_one() is True
        assert worker._runner is None  # nothing was started, let alone imported
    finally:
        worker.close()
    failed = sqlite_store.get_job(queued.id)
    assert failed.status == JobStatus.FAILED
    assert failed.error.startswith("kernel: module 'unittest.__main__' is not one this service's "
                                   "workers import (a package's __main__ is a script")


HELION_KEY = "a" * 64


def helion_capture(args: list[dict[str, Any]], module: str = "ks_trusted") -> dict[str, Any]:
    return {"kind": "helion", "version": 1, "key": HELION_KEY, "module": module, "qualname": "add",
            "args": args, "device": "cuda", "settings": {}, "key_type": "LooseAutotuneCacheKey",
            "key_fields": {"specialization_key": "(torch.float32, [16])", "kernel_source_hash": "h",
                           "hardware": "NVIDIA H200", "runtime_name": "12.8", "backend": "triton"}}


def test_captures_are_checked_against_themselves_and_the_bounds(sqlite_store: Store) -> None:
    """Issue 33.3: 64 GiB of tensors, zero (or overlapping) strides, a key size of 10^9 over 16
    elements, 2^31 programs: each a 422 naming the field (and the setting); a legit matmul-like
    call passes."""
    settings = settings_for(sqlite_store.url, job_modules=["ks_trusted"])
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        assert c.post("/v1/kernels", json=definition("ks_trusted")).status_code == 201

        def submit(cap: dict[str, Any], n: int = 8) -> tuple[int, str]:
            r = c.post("/v1/jobs", json=job_body("ks_trusted", cap, n))
            return r.status_code, r.json().get("detail", "")

        huge = 2**31
        status, detail = submit(capture(n=huge, grid=1, args=[
            tensor("x", huge, "complex128"), tensor("y", huge, "complex128"),
            {"name": "n", "kind": "scalar", "value": huge}]), n=huge)
        assert status == 422 and detail.startswith("capture.args: the tensors hold 68719476736 bytes")
        assert "KS_CAPTURE_MAX_BYTES" in detail
        status, detail = submit(capture(args=[tensor("x", strides=[0]), tensor("y"),
                                              {"name": "n", "kind": "scalar", "value": 8}]))
        assert status == 422 and detail.startswith("capture.args[0].strides: [0] make elements")
        overlap = {**tensor("x"), "shape": [3, 3], "strides": [1, 1]}
        status, detail = submit(capture(args=[overlap, tensor("y"), {"name": "n", "kind": "scalar", "value": 8}]))
        assert status == 422 and detail.startswith("capture.args[0].strides: [1, 1] make elements")
        status, detail = submit(capture(n=10**9, args=[tensor("x", 16), tensor("y", 16),
                                                       {"name": "n", "kind": "scalar", "value": 10**9}]),
                                n=10**9)
        assert status == 422 and detail.startswith("capture.args[2].value: key size n=1000000000 "
                                                   "exceeds what the call's tensors justify")
        status, detail = submit(capture(grid=2**31 - 1))
        assert status == 422 and detail.startswith("capture.grids[0]: 2147483647 programs, more "
                                                   "than this service launches (16777216, "
                                                   "KS_CAPTURE_MAX_PROGRAMS)")
        status, detail = submit(capture(grid=2**16))
        assert status == 422 and "exceed what the call's tensors justify" in detail
        # Legit: 2^20 elements in a strided (padded) layout, its grid and key size in bounds.
        padded = {**tensor("x"), "shape": [1024, 1024], "strides": [1040, 1]}
        status, detail = submit(capture(n=2**20, grid=2**18, args=[
            padded, tensor("y", 2**20), {"name": "n", "kind": "scalar", "value": 2**20}]), n=2**20)
        assert status == 202, detail
        # A Helion job: its module and its tensors' bytes.
        small = [tensor("x", 16), tensor("y", 16)]
        r = c.post("/v1/helion/jobs", json={"key": HELION_KEY, "capture": helion_capture(small, "os")})
        assert r.status_code == 422 and r.json()["detail"].startswith("capture.module: module 'os'")
        big = [tensor("x", 2**31, "complex128"), tensor("y", 2**31, "complex128")]
        r = c.post("/v1/helion/jobs", json={"key": HELION_KEY, "capture": helion_capture(big)})
        assert r.status_code == 422 and "KS_CAPTURE_MAX_BYTES" in r.json()["detail"]
        r = c.post("/v1/helion/jobs", json={"key": HELION_KEY, "capture": helion_capture(small)})
        assert r.status_code == 202, r.text


def test_a_job_past_its_wall_clock_bound_is_failed_and_its_child_killed(
        sqlite_store: Store, runners: tuple[TrialRunner, TrialRunner]) -> None:
    """Issue 33.3: KS_JOB_MAX_SECONDS ends a job whatever its trial does (a launch that stalls
    for minutes, well within the trial's own limit): the trial child is killed, the job failed."""
    settings = settings_for(sqlite_store.url, tune_reference="none", job_modules=[GOOD],
                            job_max_seconds=3.0)
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        job = _submit_good(c, "stalling_kernel")
    runner = runners[1]
    worker = Worker(settings, sqlite_store, runner=runner, owner="w")
    runner.start()
    killed_before = runner.restarts
    assert worker.run_one() is True
    failed = sqlite_store.get_job(job)
    assert failed.status == JobStatus.FAILED and failed.error is not None
    assert failed.error.startswith("ran past KS_JOB_MAX_SECONDS (3 s) on worker w: stopped, a "
                                   "trial or search in flight killed with its child process")
    assert runner.restarts == killed_before + 1  # the stalled trial's child, killed
