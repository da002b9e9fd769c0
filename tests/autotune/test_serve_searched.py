"""KS_AUTOTUNE_SERVE_SEARCHED=auto serves an undeclared kernel's searched winner on the strict
gate's evidence the record carries: the gate ran it over the key's edges (`gate_edges` kept)
and its re-measured gain's lower confidence bound is above 1.0. A gain bound of exactly 1.0, or
a record without the gate's evidence, runs the list's best by the record's own timings."""
from __future__ import annotations

import pytest
import torch
import triton
from trusted_records import trusted

import kernelsearch
import ks_undeclared_user as u
from kernelsearch.db.views import RecordIn
from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.device import INTERPRETER_DEVICE, versions
from kernelsearch.search_policy import searched_evidence, serve_searched

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("isolated_client")]
N = 200
BEYOND = triton.Config({"BLOCK": 256}, num_warps=4)


@pytest.mark.parametrize("evidence, served", [
    ({"gain_low": 1.0, "gate_edges": 2}, False),  # no improvement at the bound
    ({"gain_low": 1.0 + 1e-9, "gate_edges": 2}, True),
    ({"gain_low": 1.3, "gate_edges": 0}, True),  # the key had no edge: the gate ran on every one
    ({"gain_low": 1.3, "gate_edges": None}, False),  # no strict gate ran
    ({"gain_low": None, "gate_edges": 2}, False),
    ({"gain_low": float("inf"), "gate_edges": 2}, False),
    ({"gain_low": 1.3, "gate_edges": True}, False),
])
def test_auto_serves_an_undeclared_searched_winner_on_the_gates_evidence(evidence, served) -> None:
    record = {"winner_origin": "search", "gain_vs_list": 1.5, **evidence}
    assert searched_evidence(record) is served
    assert serve_searched(declared=False, record=record, setting="auto") is served
    assert serve_searched(declared=False, record=None, setting="auto") is False
    assert serve_searched(declared=False, record=record, setting="on") is True
    assert serve_searched(declared=True, record=record, setting="off") is False


@pytest.mark.parametrize("gain_low, gate_edges, served", [
    (1.0, 1, False), (1.2, 1, True), (1.2, None, False)])
def test_the_decorator_serves_a_searched_winner_by_the_rule(sqlite_store, monkeypatch, gain_low,
                                                           gate_edges, served) -> None:
    from kernelsearch import identity
    from kernelsearch.backends import BACKENDS

    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_SERVE_SEARCHED", "auto")
    tuner = kernelsearch.autotune(configs=u.CONFIGS, key=["n"], search_space=[BEYOND])(
        u.scale_kernel.fn)
    x = torch.randn(N)
    named = {"x_ptr": x, "y_ptr": torch.empty_like(x), "n": N}
    und = identity.undeclared_kernel(tuner, named)
    sqlite_store.save_definition(und.name, und.definition.as_json())
    timings = {canonical_key(c): 10.0 + i for i, c in enumerate(u.CONFIGS)}
    win = canonical(BEYOND)
    timings[canonical_key(win)] = 5.0
    v = versions()
    sqlite_store.upsert_best(trusted(RecordIn(
        kernel=und.name, axes={"n": N, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"},
        work=float(N), device=INTERPRETER_DEVICE, torch_version=v["torch"],
        triton_version=v["triton"], source_hash=und.definition.source_hash, config=win,
        latency_median_us=5.0, latency_min_us=5.0, latency_max_us=5.0, latency_iqr_us=0.0,
        timing_method="interpreter-wallclock", rel_error=0.0, n_trials=4, config_timings=timings,
        winner_origin="search", gain_vs_list=2.0, gain_low=gain_low, gate_edges=gate_edges)))
    BACKENDS.reset()
    y = torch.empty_like(x)
    tuner[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, y, N)
    BACKENDS.drain(20)
    torch.testing.assert_close(y, 2 * x)
    assert [s.value for s in tuner.sources.values()] == ["store"]
    assert tuner.best_config.kwargs["BLOCK"] == (256 if served else 16)


def test_the_search_space_setting_gives_every_decorated_kernel_the_derived_space(
        monkeypatch, caplog) -> None:
    """KS_AUTOTUNE_SEARCH_SPACE=derived stands for `search_space="derived"` where the code gives
    none; a space the code gives stays; an unknown value searches the list only, said once."""
    from kernelsearch.search_policy import search_space_configs

    derived = [canonical(c) for c in search_space_configs(u.CONFIGS, "derived")]
    for value, want in (("derived", derived), ("list", []), ("", []), ("wide", [])):
        monkeypatch.setenv("KS_AUTOTUNE_SEARCH_SPACE", value)
        tuner = kernelsearch.autotune(configs=u.CONFIGS, key=["n"])(u.scale_kernel.fn)
        assert [canonical(c) for c in tuner.search_space] == want, value
    assert "KS_AUTOTUNE_SEARCH_SPACE='wide'" in caplog.text
    monkeypatch.setenv("KS_AUTOTUNE_SEARCH_SPACE", "derived")
    given = kernelsearch.autotune(configs=u.CONFIGS, key=["n"], search_space=[BEYOND])(
        u.scale_kernel.fn)
    assert [canonical(c) for c in given.search_space] == [canonical(BEYOND)]


def test_a_derived_space_that_does_not_fit_never_breaks_the_import(monkeypatch, caplog) -> None:
    """FlagGems decorates a kernel whose configs name `num_stages` and `num_warps` as
    meta-parameters: with KS_AUTOTUNE_SEARCH_SPACE=derived (or search_space="derived") its
    module still imports, and workers search its list only; a list the user gives that does not
    fit stays the user's error."""
    odd = [triton.Config({"num_stages": 4, "num_warps": 8}), triton.Config({"num_stages": 2, "num_warps": 4})]
    monkeypatch.setenv("KS_AUTOTUNE_SEARCH_SPACE", "derived")
    assert kernelsearch.autotune(configs=odd, key=["n"])(u.scale_kernel.fn).search_space == []
    assert kernelsearch.autotune(configs=odd, key=["n"], search_space="derived")(
        u.scale_kernel.fn).search_space == []
    assert "does not fit them" in caplog.text
    with pytest.raises(ValueError, match="search_space"):
        kernelsearch.autotune(configs=u.CONFIGS, key=["n"], search_space=odd)(u.scale_kernel.fn)


def test_a_search_record_keeps_the_gates_evidence() -> None:
    """The worker's record of a searched winner carries what `auto` serves it on: the gain's
    lower bound and the edges the strict gate ran it on; a list winner carries neither."""
    from kernelsearch.kernels import registry
    from kernelsearch.kernels.undeclared import Definition, kernel_def
    from kernelsearch.service.search_jobs import search_record

    listed = [canonical(c) for c in u.CONFIGS]
    win = canonical(BEYOND)
    defn = Definition(name="ks_evidence.kernel", module="ks_evidence", qualname="kernel",
                      arg_names=("x_ptr", "y_ptr", "n"), key=("n",), dtype_args=("x_ptr", "y_ptr"),
                      configs=tuple(listed), search_space=(win,), source_hash="abc")
    kdef = kernel_def(defn)
    registry.register(kdef, replace=True)
    keys = [canonical_key(c) for c in listed]
    axes = {"n": N, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
    base = {"timings": {**{k: 10.0 + i for i, k in enumerate(keys)}, canonical_key(win): 5.0},
            "listed": keys, "configs": {canonical_key(c): c for c in (*listed, win)},
            "device": INTERPRETER_DEVICE, "timing_method": "interpreter-wallclock",
            "versions": versions(), "evaluated": 4}
    try:
        searched = search_record(kdef, axes, {
            **base, "winner": canonical_key(win), "winner_origin": "search", "gain": 2.0,
            "gain_low": 1.4, "gate_edges": 1, "verdict": {"speedup": 2.0}},
            study_name="s", job_id=None).value
        assert (searched.gain_low, searched.gate_edges) == (1.4, 1)
        assert serve_searched(declared=False, record=searched, setting="auto")
        listed_win = search_record(kdef, axes, {
            **base, "winner": keys[0], "winner_origin": "list", "verdict": None},
            study_name="s", job_id=None).value
        assert (listed_win.gain_low, listed_win.gate_edges) == (None, None)
    finally:
        registry.unregister(defn.name)
