"""The correctness gate checks every candidate over its kernel's declared input domain."""
from __future__ import annotations

import dataclasses

import pytest

import ks_domain_fakes
from kernelsearch.kernels.check import InputCache, check_config
from kernelsearch.kernels.device import default_device
from kernelsearch.kernels.spec import Draw, InputDomain
from kernelsearch.search_space.runner import TrialRunner

from ss_helpers import TEST_COMPILE_WORKERS

K = ks_domain_fakes.KERNEL
AXES = {"n": 256}
PLAIN = [Draw("benchmark", "benchmark"), Draw("realistic", "realistic")]


def test_domain_draws_cover_magnitudes_and_edges():
    names = [d.name for d in K.domain.draws()]
    assert names[:2] == ["benchmark", "realistic"] and names[-1] == "long"
    scales = sorted(d.scale for d in K.domain.draws() if d.scaled)
    assert scales[0] <= 1e-30 and scales[-1] >= 1e30
    assert all(d.scaled == ("g",) for d in K.domain.draws() if d.scale != 1.0)


def test_a_clean_kernel_passes_every_draw():
    res = check_config(K, AXES, {"FAULT": "none"}, seed=1)
    assert res.ok, res.detail
    assert set(res.errors) == {d.name for d in K.domain.draws()}


@pytest.mark.parametrize("fault, caught_by", [("range", "benchmark*"), ("angles", "long")])
def test_a_fault_outside_the_two_plain_draws_is_caught_by_the_domain(fault, caught_by):
    """Each fake's only fault passes today's two draws and fails the domain's stress draws."""
    plain = check_config(K, AXES, {"FAULT": fault}, seed=1, draws=PLAIN)
    assert plain.ok, plain.detail
    res = check_config(K, AXES, {"FAULT": fault}, seed=1)
    assert not res.ok
    failed = {p.split(":")[0] for p in res.detail.split("; ")}
    assert failed and all(name.startswith(caught_by) for name in failed), res.detail


def test_range_fault_fails_at_both_ends():
    res = check_config(K, AXES, {"FAULT": "range"}, seed=2)
    assert "benchmark*1e-20[g]" in res.detail and "benchmark*1e+20[g]" in res.detail
    assert "NaN" in res.detail


def test_scaled_draws_share_the_cached_unscaled_inputs():
    cache = InputCache()
    check_config(K, AXES, {"FAULT": "none"}, seed=3, cache=cache)
    n = len(cache)
    base = cache.get(K, AXES, 3, "benchmark", default_device())
    scaled = cache.get(K, AXES, 3, K.domain.draws()[2], default_device())
    assert scaled.inputs[1] is base.inputs[1]  # the angles are not copied per scale
    assert n == len(K.domain.draws())
    assert check_config(K, AXES, {"FAULT": "none"}, seed=3, cache=cache).ok
    assert len(cache) == n


def test_a_cache_past_its_byte_budget_still_checks_every_draw():
    """Past the budget only the scaled draws (a multiply from their base) are rebuilt."""
    cache = InputCache(max_bytes=0)
    assert not check_config(K, AXES, {"FAULT": "range"}, seed=4, cache=cache).ok
    assert check_config(K, AXES, {"FAULT": "none"}, seed=4, cache=cache).ok
    assert len(cache) == len([d for d in K.domain.draws() if not d.scaled])


def test_results_outside_the_float32_range_are_not_compared():
    """A draw is judged only where the float64 result is a normal float32: scaling g by 1e30
    on y = g cos(a) stays in range, so a domain with 1e40 leaves that draw out."""
    k = dataclasses.replace(K, domain=InputDomain(scale_groups=(("g",),), scales=(1e40,)))
    res = check_config(k, AXES, {"FAULT": "none"}, seed=5)
    assert res.ok and "benchmark*1e+40[g]" not in res.errors


def test_a_domain_naming_an_unknown_input_is_an_error():
    k = dataclasses.replace(K, domain=InputDomain(scale_groups=(("nope",),)))
    with pytest.raises(ValueError, match="nope"):
        check_config(k, AXES, {"FAULT": "none"}, seed=6)


@pytest.fixture(scope="module")
def domain_runner():
    r = TrialRunner(trial_timeout_s=20.0, kernel_modules=["ks_domain_fakes"],
                    compile_workers=TEST_COMPILE_WORKERS)
    try:
        yield r
    finally:
        r.close()


@pytest.mark.parametrize("fault", ["range", "angles"])
def test_a_domain_fault_is_a_wrong_result_trial(domain_runner, fault):
    out = domain_runner.run(ks_domain_fakes.NAME, AXES, {"FAULT": fault}, measure_n=2)
    assert not out.ok and out.failure_kind == "wrong_result", out
    assert out.latency_us is None and not out.timing


def test_a_clean_trial_reports_every_draw(domain_runner):
    out = domain_runner.run(ks_domain_fakes.NAME, AXES, {"FAULT": "none"}, measure_n=2)
    assert out.ok, out.message
    assert set(out.rel_errors) == {d.name for d in K.domain.draws()}


def test_a_config_failing_any_draw_is_never_a_record(ss_store, domain_runner):
    from kernelsearch.search_space.space import SearchSpace
    from kernelsearch.search_space.tuner import TuneOptions, tune_case

    store, url = ss_store
    space = SearchSpace.from_dict({"kernel": K.name, "param": [
        {"name": "FAULT", "choices": ["range", "angles", "none"]}]}, K)
    res = tune_case(K.name, AXES, store=store, storage=url, runner=domain_runner, space=space,
                    options=TuneOptions(n_trials=3, sampler="grid", seed=0, measure_n=2))
    assert res.trials.n_failed == 2 and res.best.config == {"FAULT": "none"}, res
    (rec,) = store.list_records(K.name, res.key.device)
    assert rec.config == {"FAULT": "none"}
