"""Triton's own autotune cache served by kernelsearch: a plain `@triton.autotune(cache_results=True)`
kernel, unchanged, with only TRITON_CACHE_MANAGER set. A first host benchmarks and shares the
entry as a record; a second host with a fresh Triton cache runs no benchmark."""
from __future__ import annotations


import httpx
import pytest
from at_env import child_env, run_user
from svc_helpers import LiveServer, settings_for

from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.service.api import create_app

pytestmark = [pytest.mark.timeout(600)]
NAME = "ks_triton_cache_user.triple_kernel"
MANAGER = "kernelsearch.triton_cache:AutotuneCacheManager"


def _host(n: int, env: dict, cache_dir) -> dict:
    """One fresh process on a fresh Triton cache directory: a new host."""
    return run_user("ks_triton_cache_user.py", n, env={**env, "TRITON_CACHE_DIR": str(cache_dir)})


def test_a_second_host_runs_no_benchmark(sqlite_store, tmp_path) -> None:
    app = create_app(settings_for(sqlite_store.url), store=sqlite_store)
    with LiveServer(app) as srv:
        env = child_env(KS_SERVICE_URL=srv.url, TRITON_CACHE_MANAGER=MANAGER,
                        KS_AUTOTUNE_TIMEOUT_S="10", KS_PROVIDER_TIMEOUT_S="10")
        first = _host(300, env, tmp_path / "host1")
        assert first["benched"] == 3 and first["shared"] == 1 and first["served"] == 0
        # The entry is a record: the kernel, Triton's key as axes, every config's timing.
        (rec,) = sqlite_store.list_records(kernel=NAME)
        assert rec.axes == {"n": 300, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
        assert len(rec.config_timings) == 3 and rec.config["BLOCK"] == first["best"]
        best = httpx.get(f"{srv.url}/v1/best", params={
            "kernel": NAME, "device": INTERPRETER_DEVICE, "n": 300, "x_ptr.dtype": "float32",
            "y_ptr.dtype": "float32"})
        assert best.status_code == 200 and best.json()["match"] == "exact"
        assert NAME in httpx.get(f"{srv.url}/kernels/{NAME}").text
        # A new host: its own empty Triton cache, served by kernelsearch, no benchmark.
        second = _host(300, env, tmp_path / "host2")
        assert second == {"benched": 0, "served": 1, "shared": 0, "best": first["best"]}
        # Another key is benchmarked there, as Triton would.
        other = _host(500, env, tmp_path / "host2")
        assert other["benched"] == 3 and other["served"] == 0


def test_with_the_service_down_triton_benchmarks_as_usual(tmp_path) -> None:
    env = child_env(KS_SERVICE_URL="http://127.0.0.1:9", TRITON_CACHE_MANAGER=MANAGER,
                    KS_DATABASE_URL=f"sqlite:///{tmp_path / 'absent.db'}")
    got = _host(300, env, tmp_path / "host")
    assert got["benched"] == 3 and got["served"] == 0
    # Triton's own file cache still works: the same host runs no benchmark the second time.
    again = _host(300, env, tmp_path / "host")
    assert again["benched"] == 0


def test_the_managed_kernel_sends_its_call_and_the_derived_space_the_setting_asks_for(
        sqlite_store, tmp_path) -> None:
    """KS_AUTOTUNE_SEARCH_SPACE=derived, no code changed: the shared entry's kernel carries the
    derived space beyond its list, and its call (a grid for every config) is kept for a search
    of the key, with the configs Triton's pruning kept."""
    from kernelsearch.kernels.capture import Capture

    settings = settings_for(sqlite_store.url, job_modules=["ks_triton_cache_user"])
    with LiveServer(create_app(settings, store=sqlite_store)) as srv:
        env = child_env(KS_SERVICE_URL=srv.url, TRITON_CACHE_MANAGER=MANAGER,
                        KS_AUTOTUNE_TIMEOUT_S="10", KS_PROVIDER_TIMEOUT_S="10",
                        KS_AUTOTUNE_SEARCH_SPACE="derived")
        assert _host(300, env, tmp_path / "host1")["shared"] == 1
    defn = sqlite_store.kernel_definitions()[NAME]
    assert defn["reached_by"] == "triton_cache" and len(defn["search_space"]) > 0
    ((axes, cap),) = sqlite_store.kernel_captures(NAME)
    assert axes == {"n": 300, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
    assert len(Capture.from_json(cap).grids) == 3 + len(defn["search_space"])
