"""@kernelsearch.autotune in one process: Triton's Autotuner surface, the correctness gate of a
decorated kernel, the fallbacks, and the lookup chain's order (memory, store, nearest)."""
from __future__ import annotations

import time

import pytest
import torch
import triton
import triton.language as tl
from ks_at_helpers import KERNEL, accumulate, accumulate_kernel

from kernelsearch.kernels import get_kernel
from kernelsearch.kernels.check import check_config
from kernelsearch.kernels.configs import canonical
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch import backends, options
from kernelsearch.options import Source

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for k in ("KS_SERVICE_URL", "KS_AUTOTUNE_SYNC"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")  # the opt-in policy these tests are about
    monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    backends.BACKENDS.reset()
    accumulate_kernel.forget()


def test_behaves_like_tritons_autotuner() -> None:
    assert isinstance(accumulate_kernel, triton.runtime.autotuner.Autotuner)
    assert [c.kwargs["BLOCK"] for c in accumulate_kernel.configs] == [32, 64, 32]
    assert accumulate_kernel.fn.__name__ == "accumulate_kernel"
    x = torch.randn(100)
    out = accumulate(x.clone())
    torch.testing.assert_close(out, 2 * x)
    assert accumulate_kernel.best_config is accumulate_kernel.configs[0]
    assert list(accumulate_kernel.cache.values()) == [accumulate_kernel.configs[0]]
    assert list(accumulate_kernel.sources.values()) == [Source.FIRST]


def test_registered_with_the_decorators_configs_as_its_space() -> None:
    k = get_kernel("ks_test_accumulate")
    assert k is KERNEL
    assert [c["BLOCK"] for c in k.space_configs] == [32, 64, 32]
    assert k.launch.__module__ == "ks_at_helpers"
    from kernelsearch.search_space.space import case_space

    assert case_space(k.name, {"n": 100}).grid() == [k.validate_config(c) for c in k.space_configs]


def test_gate_compares_with_the_first_config_and_honours_restore_value() -> None:
    """Every config doubles x in place; restore_value puts it back, so no config is blamed for
    modifying its input. The WRONG config differs from the first config's outputs."""
    ok, ok2, wrong = KERNEL.space_configs
    assert check_config(KERNEL, {"n": 100}, ok).ok
    assert check_config(KERNEL, {"n": 100}, ok2).ok
    res = check_config(KERNEL, {"n": 100}, wrong)
    assert not res.ok and "relative error" in res.detail


def _rank_configs(monkeypatch, fastest: int) -> None:
    """Triton's benchmark of each config, made to rank `configs[fastest]` first."""
    def bench(*args, config, **meta):
        return [1.0 if config is accumulate_kernel.configs[fastest] else 2.0] * 3

    monkeypatch.setattr(accumulate_kernel, "_bench", bench)


def test_fallback_tune_benchmarks_here_and_stores_the_record(at_store, monkeypatch) -> None:
    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "tune")
    _rank_configs(monkeypatch, 1)
    x = torch.randn(100)
    out = accumulate(x.clone())
    torch.testing.assert_close(out, 2 * x)
    (source,) = accumulate_kernel.sources.values()
    assert source is Source.TUNED_HERE
    assert accumulate_kernel.best_config is accumulate_kernel.configs[1]
    assert set(accumulate_kernel.configs_timings) == set(accumulate_kernel.configs)
    recs = at_store.list_records("ks_test_accumulate", INTERPRETER_DEVICE)
    assert [r.axes for r in recs] == [{"n": 100}]
    assert recs[0].config == canonical(accumulate_kernel.configs[1])
    assert recs[0].timing_method == "interpreter-wallclock" and recs[0].study_name == "tuned-here"

    # A new process (here: a forgotten memory) finds the record in the local store.
    accumulate_kernel.forget()
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    accumulate(x.clone())
    assert list(accumulate_kernel.sources.values()) == [Source.STORE]


def test_a_config_tuned_here_that_fails_the_gate_is_used_but_not_stored(at_store,
                                                                       monkeypatch) -> None:
    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "tune")
    _rank_configs(monkeypatch, 2)  # the WRONG config, as triton.autotune would pick it
    x = torch.randn(100)
    torch.testing.assert_close(accumulate(x.clone()), 2 * x + 1)
    assert accumulate_kernel.best_config is accumulate_kernel.configs[2]
    assert at_store.list_records("ks_test_accumulate", INTERPRETER_DEVICE) == []


def test_nearest_record_before_the_fallback(at_store, monkeypatch) -> None:
    from svc_like import put_record

    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "nearest")
    second = KERNEL.space_configs[1]
    put_record(at_store, KERNEL, {"n": 2048}, second)  # 20x the call's bytes: within the bound
    accumulate(torch.randn(100))
    (source,) = accumulate_kernel.sources.values()
    assert source is Source.NEAREST
    assert canonical(accumulate_kernel.best_config) == second
    # The miss queued one grid job over the pruned configs for the exact key.
    (job,) = at_store.list_jobs()
    assert (job.kernel, job.cases, job.sampler, job.n_trials) == \
        ("ks_test_accumulate", [{"n": 100}], "grid", 3)


def test_no_nearest_record_past_the_bound(at_store, monkeypatch) -> None:
    """The decorator answers as /v1/best does: a record at 41x the call's bytes (past
    KS_NEAREST_MAX_RATIO's 32) is not served; the call runs the first config."""
    from svc_like import put_record

    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "nearest")
    put_record(at_store, KERNEL, {"n": 4096}, KERNEL.space_configs[1])
    accumulate(torch.randn(100))
    assert list(accumulate_kernel.sources.values()) == [Source.FIRST]


def test_a_record_of_other_meta_parameters_is_not_used(at_store, monkeypatch) -> None:
    from svc_like import put_record

    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    put_record(at_store, KERNEL, {"n": 100}, {"BLOCK": 32, "num_warps": 4, "num_stages": 3})
    x = torch.randn(100)
    torch.testing.assert_close(accumulate(x.clone()), 2 * x)
    assert list(accumulate_kernel.sources.values()) == [Source.FIRST]


def test_a_record_that_does_not_build_here_falls_back_to_the_first_config(at_store,
                                                                          monkeypatch) -> None:
    from svc_like import put_record

    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    put_record(at_store, KERNEL, {"n": 100}, {"BLOCK": 48, "WRONG": 0, "num_warps": 4,
                                              "num_stages": 3})  # arange needs a power of 2
    x = torch.randn(100)
    torch.testing.assert_close(accumulate(x.clone()), 2 * x)
    assert list(accumulate_kernel.sources.values()) == [Source.FIRST]
    assert accumulate_kernel.best_config is accumulate_kernel.configs[0]


def test_using_runs_the_given_config() -> None:
    cfg = KERNEL.space_configs[2]
    x = torch.randn(50)
    with accumulate_kernel.using(cfg):
        out = accumulate(x.clone())
    torch.testing.assert_close(out, 2 * x + 1)
    assert accumulate_kernel.sources == {}  # a forced call resolves nothing
    with pytest.raises(ValueError, match="meta-parameters"):
        accumulate_kernel.using({"BLOCK": 32})


def test_options_reject_bad_values_with_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "sometimes")
    monkeypatch.setenv("KS_AUTOTUNE_TIMEOUT_S", "soon")
    opts = options.Options.from_env()
    assert opts.fallback is options.Fallback.TUNE and opts.timeout_s == 0.25
    assert "KS_AUTOTUNE_FALLBACK" in caplog.text and "KS_AUTOTUNE_TIMEOUT_S" in caplog.text


# SQLite only: this is about two ranks' processes agreeing; the store lookup rank 0 makes is the
# same on both backends (the store contract suite and test_autotune_service run both).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("sync", ["broadcast", "none"])
def test_ranks_agree_when_rank0_broadcasts(at_store, tmp_path, sync) -> None:
    """Rank 0 finds a record in its store, rank 1 finds nothing: with KS_AUTOTUNE_SYNC=broadcast
    both run rank 0's config; without, rank 1 falls back to the first config."""
    import json
    import subprocess
    import sys

    from at_env import HERE, child_env
    from svc_like import put_record

    second = KERNEL.space_configs[1]
    put_record(at_store, KERNEL, {"n": 100}, second)
    env = child_env(KS_AUTOTUNE_SYNC=sync, KS_AUTOTUNE_SUBMIT="0", KS_AUTOTUNE_TIMEOUT_S="10")
    out = subprocess.run([sys.executable, str(HERE / "at_ranks.py"),
                          f"file://{tmp_path / 'rdv'}", at_store.url,
                          f"sqlite:///{tmp_path / 'absent.db'}", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=240, cwd=HERE)
    assert out.returncode == 0, out.stderr[-3000:]
    got = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert got[0]["source"] == "store" and got[0]["config"] == second
    if sync == "broadcast":
        assert got[1]["config"] == second and got[1]["source"] == "rank0"
    else:
        assert got[1]["source"] == "first" and got[1]["config"] != second


def test_tuned_here_goes_to_the_service_when_it_is_the_only_store(at_store, monkeypatch,
                                                                  tmp_path) -> None:
    """A host that can reach only the service (its workers cannot import the kernel) uploads
    the config it tuned; the service stores it and serves it to the next process."""
    from svc_helpers import LiveServer, settings_for

    from kernelsearch.service.api import create_app

    with LiveServer(create_app(settings_for(at_store.url), store=at_store)) as server:
        monkeypatch.setenv("KS_SERVICE_URL", server.url)
        monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "tune")
        monkeypatch.setenv("KS_AUTOTUNE_TIMEOUT_S", "10")
        monkeypatch.setenv("KS_PROVIDER_TIMEOUT_S", "10")  # a loaded machine answers slowly
        _rank_configs(monkeypatch, 1)
        accumulate(torch.randn(100))
        (rec,) = at_store.list_records("ks_test_accumulate", INTERPRETER_DEVICE)
        assert rec.config == canonical(accumulate_kernel.configs[1])
        assert rec.study_name == "tuned-here"

        accumulate_kernel.forget()
        backends.BACKENDS.reset()
        monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
        accumulate(torch.randn(100))
        assert list(accumulate_kernel.sources.values()) == [Source.SERVICE]
        assert accumulate_kernel.best_config is accumulate_kernel.configs[1]


def test_record_upload_route_rejects_bad_input(at_store) -> None:
    from fastapi.testclient import TestClient
    from pydantic import SecretStr
    from svc_helpers import settings_for

    from kernelsearch.service.api import create_app

    good = {"kernel": "ks_test_accumulate", "axes": {"n": 100}, "work": 800.0,
            "device": INTERPRETER_DEVICE, "torch_version": "2", "triton_version": "3",
            "source_hash": "abc", "config": KERNEL.space_configs[0], "latency_median_us": 2.0,
            "latency_min_us": 1.0, "latency_max_us": 3.0, "latency_iqr_us": 0.5,
            "timing_method": "interpreter-wallclock", "rel_error": 0.0, "n_trials": 3,
            "tuned_at": "2026-12-01T10:00:00+00:00"}
    app = create_app(settings_for(at_store.url, api_token=SecretStr("t")), store=at_store)
    with TestClient(app) as c:
        auth = {"Authorization": "Bearer t"}
        assert c.post("/v1/records", json=good).status_code == 401
        bad = c.post("/v1/records", json={**good, "latency_min_us": 5.0}, headers=auth)
        assert bad.status_code == 422 and "latency_min_us" in bad.text
        axes = c.post("/v1/records", json={**good, "axes": {"m": 100}}, headers=auth)
        assert axes.status_code == 422 and "unknown axis 'm'" in axes.text
        unknown = c.post("/v1/records", json={**good, "kernel": "nope"}, headers=auth)
        assert unknown.status_code == 404 and "unknown kernel" in unknown.text
        ok = c.post("/v1/records", json=good, headers=auth)
        assert ok.status_code == 201 and ok.json()["config"] == KERNEL.space_configs[0]
    assert [r.axes for r in at_store.list_records("ks_test_accumulate")] == [{"n": 100}]


def test_a_cases_space_is_the_configs_the_decorators_pruning_keeps(at_store, monkeypatch) -> None:
    from ks_at_helpers import SCALE, scale, scale_kernel

    from kernelsearch.search_space.space import case_space

    blocks = lambda n: sorted(c["BLOCK"] for c in case_space(SCALE.name, {"n": n}).grid())  # noqa: E731
    assert blocks(100) == [16, 16, 64, 64]
    assert blocks(10) == [16]
    assert blocks(1000) == [16, 16, 64, 64, 256, 256]

    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    x = torch.randn(100)
    torch.testing.assert_close(scale(x), 3 * x)
    deadline = time.monotonic() + 30  # the miss queues its job in the background
    while not at_store.list_jobs() and time.monotonic() < deadline:
        time.sleep(0.1)
    (job,) = at_store.list_jobs()
    assert (job.kernel, job.cases, job.n_trials) == (SCALE.name, [{"n": 100}], 4)
    scale_kernel.forget()


def test_a_broken_local_database_costs_the_call_nothing(monkeypatch, tmp_path, caplog) -> None:
    bad = tmp_path / "broken.db"
    bad.write_bytes(b"this is not a database" * 100)
    monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{bad}")
    x = torch.randn(100)
    torch.testing.assert_close(accumulate(x.clone()), 2 * x)
    assert list(accumulate_kernel.sources.values()) == [Source.FIRST]
    assert "store unavailable" in caplog.text


@pytest.mark.parametrize("setting, timed", [("auto", True), ("off", True), ("off", False)])
def test_a_declared_kernels_searched_winner_is_served_only_where_allowed(
        at_store, monkeypatch, setting, timed) -> None:
    """KS_AUTOTUNE_SERVE_SEARCHED holds for declared kernels too: a record whose winner was
    searched beyond the list is served by default (auto), and under off the list's best by the
    record's own timings runs instead, or the key is treated as having no record."""
    from svc_like import put_record

    from kernelsearch.kernels.configs import canonical_key

    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_SERVE_SEARCHED", setting)
    listed = KERNEL.space_configs
    searched = {"BLOCK": 128, "WRONG": 0, "num_warps": 4, "num_stages": 3}
    timings = {canonical_key(listed[0]): 30.0, canonical_key(listed[1]): 20.0,
               canonical_key(listed[2]): 25.0, canonical_key(searched): 10.0} if timed else None
    put_record(at_store, KERNEL, {"n": 100}, searched, config_timings=timings,
               winner_origin="search", gain_vs_list=2.0)
    x = torch.randn(100)
    torch.testing.assert_close(accumulate(x.clone()), 2 * x)
    (source,) = accumulate_kernel.sources.values()
    if setting == "auto":
        assert source is Source.STORE and canonical_key(accumulate_kernel.best_config) == \
            canonical_key(searched)
    elif timed:
        assert source is Source.STORE and canonical_key(accumulate_kernel.best_config) == \
            canonical_key(listed[1])
    else:
        assert source is Source.FIRST


def test_the_interpreters_bench_answers_the_quantiles_asked() -> None:
    """do_bench's contract: one value per asked quantile, in that order (p20 is not the minimum)."""
    from kernelsearch import timing

    times = iter([1.0, 2.0, 3.0, 4.0, 5.0])
    orig = timing.wallclock_us
    timing.wallclock_us = lambda call, n: [next(times) * 1e3 for _ in range(n)]
    try:
        assert timing.wallclock_bench(lambda: None, (0.5, 0.2, 0.8, 0.0, 1.0)) == \
            pytest.approx([3.0, 1.8, 4.2, 1.0, 5.0])
    finally:
        timing.wallclock_us = orig


def test_the_version_is_the_installed_distributions() -> None:
    from importlib import metadata

    import kernelsearch

    assert kernelsearch.__version__ == metadata.version("kernelsearch")


@triton.jit
def _dropped_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def test_a_dropped_decorated_kernel_is_collected_and_leaves_no_entry() -> None:
    """The torch.compile registry holds its kernels weakly: a program that drops a decorated
    kernel gets its memory back (its configs, caches, the store's answers)."""
    import gc
    import weakref

    import kernelsearch
    from kernelsearch.compile_decision import TUNERS

    tuner = kernelsearch.autotune(configs=[triton.Config({"BLOCK": 32})], key=["n"])(_dropped_kernel)
    tid, alive = id(tuner), weakref.ref(tuner)
    assert TUNERS[tid] is tuner
    del tuner
    gc.collect()
    assert alive() is None
    assert tid not in TUNERS
