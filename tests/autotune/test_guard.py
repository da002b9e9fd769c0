"""Nothing kernelsearch does reaches the call: a failure at any seam of its work in a user's
process (identity, registration, lookup, key, settings, share) falls back to what
`triton.autotune` does for that call, logged once; the user's own errors propagate unchanged.
And honest sources: `first` never adopts a nearest record, a record whose winner is outside the
list is served as the record's (nothing measured, nothing uploaded), and the share check runs
after the call returns."""
from __future__ import annotations

from trusted_records import trusted

import json
import importlib
import logging
import threading
import time
from dataclasses import asdict

import pytest
import torch
import triton
import triton.language as tl

import kernelsearch
from kernelsearch.kernels.spec import config_key
from kernelsearch import backends, share, tuner
from kernelsearch.options import Source

pytestmark = [pytest.mark.timeout(300), pytest.mark.tune_default,
              pytest.mark.usefixtures("isolated_client")]
NAME = "ks_undeclared_user.scale_kernel"
CONFIGS = [triton.Config({"BLOCK": b}) for b in (16, 32, 64)]


@pytest.fixture(autouse=True)
def _nothing_told_yet(monkeypatch) -> None:
    """Each test sees the boundary's first message of each kind (they are logged once)."""
    from kernelsearch import guard

    monkeypatch.setattr(guard, "_told", set())


def _prefers_last():
    """A do_bench that makes the last config it times the fastest (as Triton's benchmark of the
    same list would, whichever autotuner calls it), counting what it timed."""
    def bench(fn, quantiles=None, **_kw):
        fn()
        bench.n += 1
        return [10.0 - bench.n] * 3
    bench.n = 0
    return bench


def _pair(**kw):
    """The same kernel under triton.autotune and under kernelsearch.autotune."""
    def body(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)

    made = []
    for deco in (triton.autotune, kernelsearch.autotune):
        made.append(deco(configs=CONFIGS, key=["n"], do_bench=_prefers_last(), **kw)(triton.jit(body)))
    return made


def _call(k, n: int):
    x, y = torch.randn(n), torch.empty(n)
    k[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    torch.testing.assert_close(y, 2 * x)
    return k.best_config.kwargs


def _raise(exc: BaseException):
    def fail(*_a, **_kw):
        raise exc
    return fail


# Each seam of kernelsearch's work in the user's process, failing as a bug or a refusal would.
SEAMS = {
    "name": None,  # a kernel name the store may refuse (300 characters)
    "identity": ("identity.kernel_def", ValueError("name: a non-empty kernel name of at most 100 characters")),
    "registration": ("registry", RuntimeError("registry broke")),
    "settings": ("options.Options.from_env", RuntimeError("settings broke")),
    "lookup": ("backends.Backends.lookup", RuntimeError("lookup broke")),
    "key": ("tuner.undeclared_key", KeyError("key broke")),
    "share": ("share._undeclared_record", RuntimeError("record broke")),
}


@pytest.mark.parametrize("seam", list(SEAMS))
def test_a_failure_of_kernelsearch_falls_back_to_what_triton_autotune_does(seam, monkeypatch,
                                                                             caplog) -> None:
    plain, swapped = _pair()
    if seam == "name":
        swapped = kernelsearch.autotune(configs=CONFIGS, key=["n"], do_bench=_prefers_last(),
                                        name="k" * 300)(swapped.fn)
    else:
        where, exc = SEAMS[seam]
        if where == "registry":
            from kernelsearch.kernels import registry

            monkeypatch.setattr(registry, "register", _raise(exc))
        else:
            path, attr = where.rsplit(".", 1)
            mod, *cls = path.split(".")
            owner = importlib.import_module(f"kernelsearch.{mod}")
            for c in cls:
                owner = getattr(owner, c)
            monkeypatch.setattr(owner, attr, _raise(exc))
    caplog.set_level(logging.WARNING)
    for n in (40, 50):  # two keys: the failure is logged once
        assert _call(swapped, n) == _call(plain, n) == {"BLOCK": 64}
        assert swapped._do_bench.n == plain._do_bench.n  # Triton's benchmark of every config
    backends.BACKENDS.drain(20)
    assert set(swapped.sources.values()) == {Source.TUNED_HERE}
    if seam != "name":
        said = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
        assert len(said) == 1 and str(SEAMS[seam][1]).strip("'") in said[0], said


@pytest.mark.parametrize("seam", [None, "lookup"])
def test_the_users_own_error_propagates_unchanged(seam, monkeypatch, caplog) -> None:
    """A user's hook that raises fails the call as under triton.autotune, with the same error,
    run as often (a boundary that took it for kernelsearch's would run Triton again)."""
    ran: list[int] = []

    def hook(nargs, reset_only=False):
        ran.append(1)
        raise LookupError("the user's own hook")

    plain, swapped = _pair(pre_hook=hook)
    if seam == "lookup":
        monkeypatch.setattr(backends.Backends, "lookup", _raise(RuntimeError("lookup broke")))
    with pytest.raises(LookupError, match="the user's own hook"):
        _call(plain, 40)
    under_triton, ran[:] = len(ran), []
    caplog.set_level(logging.WARNING)
    with pytest.raises(LookupError, match="the user's own hook") as got:
        _call(swapped, 40)
    assert len(ran) == under_triton
    assert getattr(got.value, "__cause__", None) is None
    assert ("falling back" in caplog.text) is (seam == "lookup")


def _tuned_record(sqlite_store, monkeypatch, x):
    """The undeclared user kernel tuned here once under the default policy: its record."""
    import ks_undeclared_user as u

    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "tune")
    u.scale_kernel.forget()
    u.scale(x)
    backends.BACKENDS.drain(20)
    (rec,) = sqlite_store.list_records(kernel=NAME)
    return u, rec


def test_sources_name_what_ran(sqlite_store, monkeypatch) -> None:
    """A record whose winner is outside this process's list is served as the record's fastest
    listed config (0 benchmarks, nothing uploaded), and under `first` a lookup slower than the
    bound never makes the key adopt a nearest record later: it runs the first config."""
    from kernelsearch.db.views import RecordIn

    x = torch.randn(64)
    u, rec = _tuned_record(sqlite_store, monkeypatch, x)
    outside = {**rec.config, "BLOCK": 256}
    timings = {k: (5.0 if json.loads(k)["BLOCK"] == 32 else 9.0) for k in rec.config_timings}
    fields = {k: v for k, v in asdict(rec).items() if k in RecordIn.__dataclass_fields__}
    sqlite_store.upsert_best(trusted(RecordIn(**{
        **fields, "config": outside, "config_timings": {**timings, config_key(outside): 1.0},
        "latency_median_us": 1.0, "latency_min_us": 1.0, "latency_max_us": 1.0})))
    uploads: list[object] = []
    monkeypatch.setattr(backends.Backends, "upload", lambda self, *a, **k: uploads.append(a))
    u.scale_kernel.forget()
    backends.BACKENDS.reset()
    u.BENCHED.clear()
    u.scale(x)
    backends.BACKENDS.drain(20)
    assert list(u.scale_kernel.sources.values()) == [Source.STORE]
    assert u.scale_kernel.best_config.kwargs["BLOCK"] == 32 and u.BENCHED == [] and uploads == []

    # `first`, a lookup slower than the bound: the late answer (the nearest record, n=64 for
    # n=80) is not adopted.
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    monkeypatch.setenv("KS_AUTOTUNE_TIMEOUT_S", "0.05")
    monkeypatch.setenv("KS_AUTOTUNE_SUBMIT", "0")
    lookup, adopt, late = backends.Backends.lookup, tuner.Autotuner._adopt, threading.Event()

    def slow_lookup(self, *a, **k):
        time.sleep(0.3)
        return lookup(self, *a, **k)

    def adopt_then_say(self, *a, **k):
        adopt(self, *a, **k)
        late.set()

    monkeypatch.setattr(backends.Backends, "lookup", slow_lookup)
    monkeypatch.setattr(tuner.Autotuner, "_adopt", adopt_then_say)
    u.scale_kernel.forget()
    backends.BACKENDS.reset()
    u.scale(torch.randn(80))
    assert late.wait(30)
    ((key, source),) = u.scale_kernel.sources.items()
    config, now = u.scale_kernel.resolved(key)
    assert source is now is Source.FIRST and config.kwargs == u.CONFIGS[0].kwargs


def test_the_share_check_runs_after_the_call_returns(sqlite_store, monkeypatch) -> None:
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    _, swapped = _pair()
    gate, finished = threading.Event(), threading.Event()
    compare = share.written_mismatches

    def held(*a, **k):
        gate.wait(5)
        got = compare(*a, **k)
        finished.set()
        return got

    monkeypatch.setattr(share, "written_mismatches", held)
    assert _call(swapped, 40) == {"BLOCK": 64}
    assert not finished.is_set()  # the call's result did not wait for the check
    gate.set()
    backends.BACKENDS.drain(20)
    assert finished.is_set()
    (rec,) = sqlite_store.list_records(kernel=swapped.undeclared.name)
    assert rec.config["BLOCK"] == 64


def test_the_hooks_fall_back_too(monkeypatch, caplog, tmp_path) -> None:
    """The Helion backend and the Triton cache manager: a failure of their own work is a miss
    (Helion tunes, Triton benchmarks) or an entry not shared, never an error in the user's call."""
    pytest.importorskip("helion")
    from kernelsearch import helion as ks_helion
    from kernelsearch import triton_cache

    monkeypatch.setenv("KS_SERVICE_URL", "http://127.0.0.1:9")
    monkeypatch.setattr(ks_helion, "_caller", _raise(RuntimeError("frames broke")))
    monkeypatch.setattr(ks_helion, "_miss_cache", _raise(RuntimeError("frames broke")))
    backend = ks_helion.KernelsearchBackend()
    assert backend.get("k" * 64) is None
    assert backend.put("k" * 64, "{}") is None
    assert list(backend.list(5)) == []
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(triton_cache, "_autotune_call", _raise(RuntimeError("frames broke")))
    manager = triton_cache.AutotuneCacheManager("ks-guard-test")
    assert manager.get_file("body.autotune.json") is None
    assert "frames broke" in caplog.text
