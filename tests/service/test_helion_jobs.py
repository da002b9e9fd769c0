"""KS_HELION_ON_MISS=default: a Helion cache miss runs Helion's default config at once and
queues a job with the call's capture; a worker tunes it with the kernel's own autotuner and
stores the entry, which later processes are served. All on the CPU, through a live service."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from svc_helpers import LiveServer, settings_for, spy_cuda_probes

pytest.importorskip("helion")

import helion_job_kernel as hk  # noqa: E402

from kernelsearch.db.statuses import JobStatus  # noqa: E402
from kernelsearch.db.store import Store  # noqa: E402
from kernelsearch.backends import BACKENDS  # noqa: E402
from kernelsearch.search_space.acceptance import HELION_CHECKED  # noqa: E402
from kernelsearch.service.api import create_app  # noqa: E402
from kernelsearch.rest_client import Client, InvalidRequest  # noqa: E402
from kernelsearch.search_space.helion_job import parse_job  # noqa: E402
from kernelsearch.service.worker import Worker  # noqa: E402

TOKEN = "tok"
# The modules these tests' jobs name, as an operator allows them (KS_JOB_MODULES).
MODULES = ["helion_job_kernel", "no_such_helion_module", "ks_poison_exit", "ks_poison_crash"]
HERE = Path(__file__).parent

# A user's program: one call of the kernel, then what Helion did.
USER = """
import json, torch
import helion_job_kernel as hk
from helion._utils import counters
hk.use_cpu_timer()
x, y = torch.randn(16), torch.randn(16)
out = hk.add(x, y)
print(json.dumps({"correct": bool(torch.equal(out, x + y)), "searches": len(hk.SEARCHES),
                  "config": json.loads(hk.add.bind((x, y))._config.to_json()),
                  "autotune": dict(counters["autotune"])}))
"""


@pytest.fixture(autouse=True)
def _fresh_connection() -> Iterator[None]:
    BACKENDS.reset()
    yield
    BACKENDS.reset()


@pytest.fixture
def server(sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    app = create_app(settings_for(sqlite_store.url, api_token=TOKEN, job_modules=MODULES), store=sqlite_store)
    with LiveServer(app) as s:
        monkeypatch.setenv("KS_SERVICE_URL", s.url)
        monkeypatch.setenv("KS_API_TOKEN", TOKEN)
        monkeypatch.setenv("KS_HELION_TIMEOUT_S", "30")  # a loaded machine answers slowly
        monkeypatch.setenv("HELION_REMOTE_CACHE_BACKEND", "kernelsearch.helion.KernelsearchBackend")
        monkeypatch.setenv("HELION_AUTOTUNE_CACHE", "RemoteAutotuneCache")
        monkeypatch.setattr("helion.autotuner.benchmark_provider.do_bench", _cpu_do_bench())
        monkeypatch.setenv("KS_TEST_HELION_CPU_TIMER", "1")  # the same in a worker's job child
        yield s


def _cpu_do_bench() -> Any:
    from helion.autotuner.benchmarking import do_bench_generic

    return do_bench_generic


def run_user(server: LiveServer, cache_dir: Path, on_miss: str = "default") -> dict[str, Any]:
    """A fresh user process's first call of the kernel, with its own Helion cache directory."""
    env = {**os.environ, "KS_HELION_ON_MISS": on_miss, "HELION_CACHE_DIR": str(cache_dir),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", USER], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(store: Store, **kw: Any) -> Worker:
    return Worker(settings_for(store.url, **{"job_modules": MODULES, **kw}), store, owner="helion-worker")


def default_config() -> dict[str, Any]:
    x = torch.randn(16)
    return json.loads(hk.add.bind((x, x)).config_spec.default_config().to_json())


def test_a_miss_runs_the_default_config_and_a_worker_tunes_it_for_later_processes(
        server: LiveServer, sqlite_store: Store, tmp_path: Path) -> None:
    first = run_user(server, tmp_path / "host1")
    # No search in the user's process: Helion took the answer as a cache hit, ran the default.
    assert first["correct"] and first["searches"] == 0
    assert first["autotune"].get("cache_miss", 0) == 0 and first["autotune"]["cache_hit"] == 1
    assert first["config"] == default_config()
    (job,) = sqlite_store.list_jobs()
    assert job.kernel == "helion:helion_job_kernel.add" and job.status == JobStatus.QUEUED
    cap = job.capture
    assert cap is not None and cap["kind"] == "helion" and cap["module"] == "helion_job_kernel"
    assert cap["qualname"] == "add" and cap["device"] == "cpu"
    assert [(a["name"], a["shape"], a["dtype"]) for a in cap["args"]] == [("x", [16], "float32"), ("y", [16], "float32")]
    assert cap["settings"]["autotune_cache"] == "RemoteAutotuneCache" and cap["key_fields"]["hardware"] == "cpu"
    key = cap["key"]
    assert job.cases == [{"x.dtype": "float32", "x.size0": 16, "y.dtype": "float32", "y.size0": 16,
                          "helion_key": key}]
    with Client(server.url) as c:
        assert c.helion_get(key) is None  # the default config is not shared as an entry
        listed = httpx.get(f"{server.url}/v1/jobs").json()
    assert listed[0]["kernel"] == "helion:helion_job_kernel.add" and listed[0]["captured"] is True

    # A worker tunes it: the kernel's own search, the entry through the gate, the job done.
    assert worker(sqlite_store).run_one()
    done = sqlite_store.get_job(job.id)
    assert done is not None and done.status == JobStatus.SUCCEEDED, done.error
    with Client(server.url) as c:
        (entry,) = c.helion_list(10)
    assert entry["key"] == key and entry["kernel"] == "helion:helion_job_kernel.add"
    assert entry["checked_by"] == HELION_CHECKED and entry["hardware"] == "cpu"
    tuned = entry["config"]
    assert tuned in [json.loads(c.to_json()) for c in hk.CONFIGS]
    assert done.best == {"helion_key": key, "config": tuned, "compiled_groups": 0}  # interpreter
    assert json.loads(entry["data"])["key"]["fields"]["hardware"] == "cpu"  # Helion's own entry text
    page = httpx.get(f"{server.url}/jobs/{job.id}")
    assert page.status_code == 200 and "helion:helion_job_kernel.add" in page.text
    assert 'href="/helion?kernel=helion%3Ahelion_job_kernel.add"' in page.text and "/case?" not in page.text

    # A later process on the same host (its local cache holds the default) is served the tuned one.
    later = run_user(server, tmp_path / "host1")
    assert later["correct"] and later["searches"] == 0 and later["config"] == tuned
    assert json.loads(json.loads((tmp_path / "host1" / f"{key}.best_config").read_text())["config"]) == tuned
    assert len(sqlite_store.list_jobs()) == 1


def _cache() -> hk.CpuRemoteAutotuneCache:
    x, y = torch.randn(16), torch.randn(16)
    bound = hk.add.bind((x, y))
    return hk.CpuRemoteAutotuneCache(hk.CountingSearch(bound, (x, y), hk.CONFIGS))


def test_a_key_gets_one_job_while_it_is_queued(server: LiveServer, sqlite_store: Store,
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HELION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KS_HELION_ON_MISS", "default")
    cache = _cache()
    assert cache.get() is not None and cache.get() is not None  # two misses, each the default config
    assert len(sqlite_store.list_jobs()) == 1
    with Client(server.url, token=TOKEN) as c:
        again = c.helion_queue(cache.key.stable_hash(), sqlite_store.list_jobs()[0].capture)
    assert again["existing"] is True and len(sqlite_store.list_jobs()) == 1


def test_the_default_policy_and_a_worker_tuning_queue_nothing(server: LiveServer, sqlite_store: Store,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    from kernelsearch.search_space import helion_job

    monkeypatch.setenv("HELION_CACHE_DIR", str(tmp_path))
    assert _cache().get() is None  # KS_HELION_ON_MISS unset: tune, as before
    monkeypatch.setenv("KS_HELION_ON_MISS", "default")
    with helion_job.tuning():  # what a worker's Helion job runs under
        assert _cache().get() is None
    assert sqlite_store.list_jobs() == []


def test_with_the_local_store_only_a_miss_tunes_with_one_warning(sqlite_store: Store, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    import kernelsearch.helion as ksh

    monkeypatch.delenv("KS_SERVICE_URL", raising=False)
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_HELION_TIMEOUT_S", "30")
    monkeypatch.setenv("KS_HELION_ON_MISS", "default")
    monkeypatch.setenv("HELION_REMOTE_CACHE_BACKEND", "kernelsearch.helion.KernelsearchBackend")
    monkeypatch.setenv("HELION_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ksh, "_warned_local", False)
    with caplog.at_level(logging.WARNING, logger="kernelsearch.helion"):
        assert _cache().get() is None and _cache().get() is None
    warned = [r for r in caplog.records if "KS_HELION_ON_MISS=default needs a service" in r.getMessage()]
    assert len(warned) == 1 and sqlite_store.list_jobs() == []


def _queued_capture(server: LiveServer, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch,
                    tmp_path: Path) -> dict[str, Any]:
    monkeypatch.setenv("HELION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KS_HELION_ON_MISS", "default")
    assert _cache().get() is not None
    (job,) = sqlite_store.list_jobs()
    sqlite_store.cancel_job(job.id)
    assert job.capture is not None
    return dict(job.capture)


def test_a_worker_with_another_key_or_without_the_module_fails_the_job(
        server: LiveServer, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cap = _queued_capture(server, sqlite_store, monkeypatch, tmp_path)
    other = "0" * 64
    with Client(server.url, token=TOKEN) as c:
        c.helion_queue(other, {**cap, "key": other})
        c.helion_queue(other, {**cap, "key": other, "module": "no_such_helion_module"})
    assert worker(sqlite_store, capture_import_tries=1).run_one()
    assert worker(sqlite_store, capture_import_tries=1).run_one()
    mismatch, missing = sorted((j for j in sqlite_store.list_jobs() if j.status != JobStatus.CANCELLED),
                               key=lambda j: j.id)
    assert mismatch.status == JobStatus.FAILED and mismatch.error is not None
    assert "key mismatch" in mismatch.error and other in mismatch.error and cap["key"] in mismatch.error
    assert missing.status == JobStatus.FAILED and missing.error is not None
    assert "no_such_helion_module" in missing.error and "KS_KERNEL_MODULES" in missing.error
    with Client(server.url) as c:
        assert c.helion_list(10) == []  # nothing stored under a key the worker did not tune


def test_a_helion_job_whose_module_exits_or_crashes_fails_alone(
        server: LiveServer, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 33.1: a Helion job runs in a child process of its own; a module that exits
    (SystemExit) or crashes (SIGSEGV) on import ends that child and fails its job naming the
    module, and the worker claims the next job."""
    cap = _queued_capture(server, sqlite_store, monkeypatch, tmp_path)
    with Client(server.url, token=TOKEN) as c:
        ids = [c.helion_queue(key, {**cap, "key": key, "module": module})["id"]
               for key, module in (("2" * 64, "ks_poison_exit"), ("3" * 64, "ks_poison_crash"))]
    w = worker(sqlite_store)
    assert w.run_one() and w.run_one()
    exited, crashed = (sqlite_store.get_job(i) for i in ids)
    assert exited is not None and exited.status == JobStatus.FAILED and exited.error is not None
    assert "raised SystemExit: 3" in exited.error and "'ks_poison_exit'" in exited.error
    assert crashed is not None and crashed.status == JobStatus.FAILED and crashed.error is not None
    assert "was killed by SIGSEGV" in crashed.error and "'ks_poison_crash'" in crashed.error
    assert "lives on" in crashed.error


def test_a_helion_job_submit_is_checked(server: LiveServer, sqlite_store: Store,
                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cap = _queued_capture(server, sqlite_store, monkeypatch, tmp_path)
    key = cap["key"]
    bad = {
        "capture.key": {**cap, "key": "1" * 64},
        "capture.module": {**cap, "module": "not a module"},
        "capture.args[0].dtype": {**cap, "args": [{**cap["args"][0], "dtype": "float99"}]},
        "capture.settings.autotuner_fn": {**cap, "settings": {"autotuner_fn": "os.system"}},
        "capture.key_fields.hardware": {**cap, "key_fields": {**cap["key_fields"], "hardware": ""}},
        "capture.kind": {**cap, "kind": "triton"},
    }
    with Client(server.url, token=TOKEN) as c:
        for field, capture in bad.items():
            with pytest.raises(InvalidRequest, match=field.replace("[", r"\[").replace("]", r"\]")):
                c.helion_queue(key, capture)
    anon = httpx.post(f"{server.url}/v1/helion/jobs", json={"key": key, "capture": cap})
    assert anon.status_code == 401
    assert len(sqlite_store.list_jobs()) == 1


def test_a_worker_that_lost_its_lease_stores_nothing(server: LiveServer, sqlite_store: Store,
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another worker claims the job while this one tunes (its lease lapsed): the entry this one
    tuned is not written, and the job is left to the new holder."""
    from kernelsearch.service import helion_jobs

    cap = _queued_capture(server, sqlite_store, monkeypatch, tmp_path)
    with Client(server.url, token=TOKEN) as c:
        job_id = c.helion_queue(cap["key"], cap)["id"]
    real = helion_jobs.tune

    def tune_then_lose_the_lease(job: Any, owner: str, **kw: Any) -> Any:
        tuned = real(job, owner, **kw)
        assert sqlite_store.claim_job("other-worker", 1e-6) is not None
        return tuned

    monkeypatch.setattr(helion_jobs, "tune", tune_then_lose_the_lease)
    assert worker(sqlite_store).run_one()
    job = sqlite_store.get_job(job_id)
    assert job is not None and job.status == JobStatus.RUNNING and job.owner == "other-worker"
    assert sqlite_store.get_helion_entry(cap["key"]) is None


def test_a_worker_without_helion_fails_the_job(server: LiveServer, sqlite_store: Store,
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cap = _queued_capture(server, sqlite_store, monkeypatch, tmp_path)
    with Client(server.url, token=TOKEN) as c:
        job_id = c.helion_queue(cap["key"], cap)["id"]
    monkeypatch.setitem(sys.modules, "helion.autotuner.local_cache", None)  # import fails as uninstalled
    assert worker(sqlite_store).run_one()
    job = sqlite_store.get_job(job_id)
    assert job is not None and job.status == JobStatus.FAILED and job.error is not None
    assert "Helion is not installed on worker helion-worker" in job.error


def test_a_key_whose_job_failed_is_not_queued_again_until_the_back_off_ends(
        server: LiveServer, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cap = _queued_capture(server, sqlite_store, monkeypatch, tmp_path)
    other = "1" * 64  # a key this worker's Helion does not compute: its job fails
    with Client(server.url, token=TOKEN) as c:
        first = c.helion_queue(other, {**cap, "key": other})
        assert worker(sqlite_store).run_one()
        assert sqlite_store.get_job(first["id"]).status == JobStatus.FAILED
        again = c.helion_queue(other, {**cap, "key": other})
    # The failed job answers (KS_HELION_FAILED_RETRY_S, an hour by default): no job per miss.
    assert again["existing"] is True and again["id"] == first["id"] and again["status"] == "failed"
    assert sum(1 for j in sqlite_store.list_jobs() if j.status != JobStatus.CANCELLED) == 1
    # With no back-off the next miss queues a new job.
    job = parse_job({**cap, "key": other})
    queued, existing = sqlite_store.queue_job(job.job_kernel, [job.case()], 1, "helion",
                                              capture=job.as_json(), failed_backoff_s=0)
    assert existing is False and queued.id != first["id"]
    with pytest.raises(ValueError, match="failed_backoff_s"):
        sqlite_store.queue_job(job.job_kernel, [job.case()], 1, "helion", capture=job.as_json(),
                               failed_backoff_s=-1)



def test_a_worker_running_a_helion_job_never_probes_the_gpu_itself(
        server: LiveServer, sqlite_store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Helion's search runs in the job child, spawned (a child forked from a process that probed
    CUDA cannot use it): the worker asks no CUDA question of torch while it runs the job."""
    cap = _queued_capture(server, sqlite_store, monkeypatch, tmp_path)
    with Client(server.url, token=TOKEN) as c:
        job_id = c.helion_queue(cap["key"], cap)["id"]
    assert sqlite_store.get_job(job_id).kind == "helion"
    probes = spy_cuda_probes(monkeypatch)
    assert worker(sqlite_store).run_one()
    done = sqlite_store.get_job(job_id)
    assert done is not None and done.status == JobStatus.SUCCEEDED, done.error
    assert probes == []
