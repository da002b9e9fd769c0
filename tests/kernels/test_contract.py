"""The contract every kernel passes: declaration, validation, correctness, inputs, provider."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from kernelsearch import kernels
from kernelsearch.kernels import provider
from kernelsearch.kernels.check import InputCache, check_config, rel_error
from kernelsearch.kernels.errors import FailureKind, InvalidConfig, WrongResult, classify
from kernelsearch.kernels.measure import WALLCLOCK, Timing, time_call
from kernelsearch.kernels.resolve import Found, Match, Resolver, SourceUnavailable

ON_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU; a covering subset runs under the interpreter")


def test_builtin_kernels_come_through_the_entry_point_group():
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="kernelsearch.kernels")}
    assert {"vision_rope_generation_bwd", "vision_rope3d_spatial_merge_bwd"} <= names
    assert set(kernels.kernel_names()) >= names


def test_describe_is_json(kdef):
    d = json.loads(json.dumps(kdef.describe()))
    assert d["name"] == kdef.name
    assert d["n_cases"] == len(kdef.cases)
    assert [p["name"] for p in d["params"]] == [p.name for p in kdef.params]
    assert {p["name"] for p in d["params"] if p["launch_option"]} <= {"num_warps", "num_stages",
                                                                     "num_ctas", "maxnreg"}


def test_suite_cases_numbered_valid_and_distinct(kdef):
    assert [c.number for c in kdef.cases] == list(range(1, len(kdef.cases) + 1))
    for c in kdef.cases:
        assert kdef.validate_axes(c.axes) == c.axes
        assert kdef.suite_case_of(c.axes) is c
        assert kdef.bytes_moved(c.axes) > 0
    assert len({tuple(c.axes.items()) for c in kdef.cases}) == len(kdef.cases)


def test_source_identity_is_stable(kdef):
    assert kdef.source_hash == kdef.source_hash and len(kdef.source_hash) == 16


def test_default_config_valid(kdef):
    assert kdef.validate_config(None) == kdef.default_config
    assert kdef.validate_config({}) == kdef.default_config


def test_unknown_parameter_named(kdef):
    with pytest.raises(InvalidConfig, match="BOGUS"):
        kdef.validate_config({"BOGUS": 1})


def test_bad_value_named(kdef):
    for p in kdef.params:
        bad = "not-a-choice" if all(isinstance(c, (int, float)) for c in p.choices) else 3
        with pytest.raises(InvalidConfig, match=p.name):
            kdef.validate_config({p.name: bad})


def test_bool_is_not_an_int(kdef):
    ints = [p for p in kdef.params if all(type(c) is int for c in p.choices)]
    assert ints, "each kernel has an integer parameter (num_warps at least)"
    with pytest.raises(InvalidConfig, match=ints[0].name):
        kdef.validate_config({ints[0].name: True})


def test_conditional_parameter_rejected_when_inactive(kdef):
    cond = [p for p in kdef.params if p.requires]
    if not cond:
        pytest.skip(f"{kdef.name} has no conditional parameter")
    p = cond[0]
    other = next(v for v in p.choices if v != p.default)
    with pytest.raises(InvalidConfig, match=p.name):
        kdef.validate_config({p.name: other, **{k: next(x for x in kdef.param(k).choices if x not in v)
                                                for k, v in p.requires.items()}})


def test_config_must_be_mapping(kdef):
    with pytest.raises(InvalidConfig):
        kdef.validate_config([("num_warps", 4)])


def _bad_axes(kdef):
    good = {a.name: (a.choices[0] if a.categorical else a.minimum) for a in kdef.axes}
    yield {}
    yield {**good, "nope": 3}
    for a in kdef.axes:
        if a.categorical:
            yield {**good, a.name: "not-a-" + a.name}
            yield {**good, a.name: 3}
        else:
            yield {**good, a.name: a.minimum - 1}
            yield {**good, a.name: a.maximum + 1}
            yield {**good, a.name: "x"}
            yield {**good, a.name: 1.5}
            yield {**good, a.name: True}
            yield {**good, a.name: "1_0"}


def test_bad_axes(kdef):
    for bad in _bad_axes(kdef):
        with pytest.raises(ValueError):
            kdef.validate_axes(bad)


def test_default_correct_on_odd_shapes(kdef, small_axes):
    """The whole domain on each odd shape; under the interpreter the largest shape (nine tenths
    of the cost) takes the plain draws only, the smaller ones still the whole domain."""
    plain = [d for d in kdef.domain.draws() if not d.scaled]
    for i, axes in enumerate(small_axes):
        draws = plain if not ON_GPU and i == len(small_axes) - 1 else None
        res = check_config(kdef, axes, kdef.default_config, seed=7, draws=draws)
        assert res.ok, (axes, res.detail)
        assert res.max_error < kdef.rtol_for(axes)


def _plain_and_extremes(kdef):
    """The plain draws, the domain's extreme magnitudes and its edges: the whole domain on every
    sampled config costs minutes under the interpreter (test_domain covers the rest)."""
    scales = [d.scale for d in kdef.domain.draws() if d.scaled]
    return [d for d in kdef.domain.draws()
            if not d.scaled or d.scale in (min(scales), max(scales))]


@pytest.fixture(scope="module")
def input_caches() -> dict[str, InputCache]:
    """One cache of draws and float64 references per kernel, shared by the module's checks."""
    return {}


def test_sampled_configs_correct(kdef, small_axes, covering_configs, input_caches):
    """Every value of every parameter in a few configs (a covering design), on an odd shape: each
    config on the benchmark draw and, between them, every draw of the plain and extreme ones (the
    whole sweep is test_gpu_sampled_configs_correct; under the interpreter it costs minutes)."""
    axes = small_axes[1]
    cfgs = covering_configs(kdef)
    draws = _plain_and_extremes(kdef)
    first = next(d for d in draws if not d.scaled)
    rest = [d for d in draws if d is not first]
    cache = input_caches.setdefault(kdef.name, InputCache())
    bad = []
    for i, cfg in enumerate(cfgs):
        mine = [first] + rest[i::len(cfgs)]
        res = check_config(kdef, axes, cfg, seed=3, draws=mine, cache=cache)
        if not res.ok:
            bad.append((cfg, res.detail))
    assert not bad, bad


@gpu
@pytest.mark.gpu
def test_gpu_sampled_configs_correct(kdef, small_axes, sample_configs):
    """Every parameter value and a random sample, on an odd shape, each on the plain draws and
    the domain's extremes."""
    axes = small_axes[1]
    cfgs = sample_configs(kdef, n=6, seed=11)
    listed = len(kdef.space) if isinstance(kdef.space, (list, tuple)) else None
    assert len(cfgs) >= (listed or sum(len(p.choices) for p in kdef.params) // 2)
    bad = []
    for cfg in cfgs:
        res = check_config(kdef, axes, cfg, seed=3, draws=_plain_and_extremes(kdef))
        if not res.ok:
            bad.append((cfg, res.detail))
    assert not bad, bad


def test_suite_case_shape_correct(kdef):
    """The smallest suite case at its real size, default config, the plain draws (the shape is
    the point here; the domain is checked on the odd shapes); under the interpreter the first."""
    c = min(kdef.cases, key=lambda c: kdef.bytes_moved(c.axes))
    dists = kdef.domain.distributions if ON_GPU else kdef.domain.distributions[:1]  # minutes here
    res = check_config(kdef, c.axes, kdef.default_config, seed=5, distributions=dists)
    assert res.ok, res.detail


def test_call_returns_fresh_outputs_of_the_declared_dtypes_and_leaves_inputs(kdef, small_axes):
    axes = small_axes[1]
    inputs = kdef.make_inputs(axes, seed=1)
    before = [t.clone() for t in inputs]
    out = kdef(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    assert len(outs) == len(kdef.output_names)
    for o, dt in zip(outs, kdef.output_dtypes_for(axes)):
        assert o.dtype == dt
        assert all(o.data_ptr() != t.data_ptr() for t in inputs)
    for a, b in zip(inputs, before):
        assert torch.equal(a, b)
    refs = kdef.reference(*inputs)
    for o, r in zip(outs, refs):
        assert rel_error(o, r) < kdef.rtol_for(axes)


def test_reference_matches_torch_reference(kdef, small_axes):
    if kdef.torch_reference is None:
        pytest.skip(f"{kdef.name} declares no PyTorch reference")
    inputs = kdef.make_inputs(small_axes[2], seed=4)
    for a, b in zip(kdef.torch_reference(*inputs), kdef.reference(*inputs)):
        assert rel_error(a, b) < max(1e-5, kdef.rtol_for(small_axes[2]))


def test_bad_inputs_named(kdef, small_axes):
    axes = small_axes[1]
    inputs = list(kdef.make_inputs(axes, seed=2))
    names = kdef.input_names
    # wrong dtype
    for i, name in enumerate(names):
        bad = list(inputs)
        bad[i] = inputs[i].to(torch.float64) if inputs[i].dtype != torch.float64 else inputs[i].float()
        with pytest.raises(ValueError, match=name):
            kdef(*bad)
    # a shape that does not fit the others: the last input one column or one row short (one of
    # the two is always wrong: a matmul's b may lose a column and still fit)
    refused = []
    for cut in (lambda t: t[..., :-1], lambda t: t[:-1]):
        bad = list(inputs)
        bad[-1] = cut(inputs[-1]).contiguous()
        try:
            kdef(*bad)
        except ValueError as exc:
            refused.append(str(exc))
    assert refused and all(any(n in msg for n in names) for msg in refused), refused
    # non-contiguous: the same values every other element of a wider buffer
    i = next(j for j, t in enumerate(inputs) if t.dim() >= 1 and t.shape[-1] > 1)
    t = inputs[i]
    nc = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)[..., ::2]
    nc.copy_(t)
    assert not nc.is_contiguous()
    bad = list(inputs)
    bad[i] = nc
    with pytest.raises(ValueError, match=names[i]):
        kdef(*bad)
    # not a tensor, wrong count
    with pytest.raises(ValueError, match=names[0]):
        kdef(None, *inputs[1:])
    with pytest.raises(TypeError):
        kdef(*inputs[:-1])


def test_config_keyword_validated(kdef, small_axes):
    inputs = kdef.make_inputs(small_axes[0], seed=2)
    with pytest.raises(InvalidConfig, match="BOGUS"):
        kdef(*inputs, config={"BOGUS": 1})


class _Source:
    """A `ConfigSource` answering one config for every key (exact), or failing."""

    name = "test"

    def __init__(self, answer=None, fail=False):
        self.answer, self.fail, self.calls = answer, fail, 0

    def get(self, key, near, fresh):
        self.calls += 1
        if self.fail:
            raise SourceUnavailable("store down")
        return None if self.answer is None else Found(dict(self.answer), Match.EXACT, self.name)

    def known(self, key, near):
        return None


def _resolver(source):
    return Resolver([source], retry_s=0.0)


@pytest.fixture
def restore_provider():
    yield
    provider.set_resolver(None)


def test_provider_config_used_and_cached(kdef, small_axes, restore_provider, sample_configs):
    axes = small_axes[0]
    inputs = kdef.make_inputs(axes, seed=2)
    cfg = next(c for c in sample_configs(kdef, n=4, seed=0) if c != kdef.default_config)
    p = _Source(answer=cfg)
    provider.set_resolver(_resolver(p))
    assert kdef.resolve_config(kdef.axes_of(*inputs), inputs[0].device) == kdef.validate_config(cfg)
    kdef(*inputs)
    kdef(*inputs)
    assert p.calls == 1


def test_provider_failure_falls_back(kdef, small_axes, restore_provider):
    inputs = kdef.make_inputs(small_axes[0], seed=2)
    provider.set_resolver(_resolver(_Source(fail=True)))
    assert kdef.resolve_config(kdef.axes_of(*inputs), inputs[0].device) == kdef.default_config
    out = kdef(*inputs)
    assert out is not None
    provider.set_resolver(_resolver(_Source(answer={"BOGUS": 1})))
    assert kdef.resolve_config(kdef.axes_of(*inputs), inputs[0].device) == kdef.default_config


def test_wrong_result_is_detected(kdef, small_axes):
    """A launcher that writes a wrong value, or leaves an element unwritten, fails the check."""
    axes = small_axes[1]
    real = kdef.launch

    def off_by_a_bit(*inputs, config, out=None):
        outs = real(*inputs, config=config, out=out)
        outs[0].view(-1)[0] += 1.0
        return outs

    def unwritten(*inputs, config, out=None):
        outs = real(*inputs, config=config, out=out)
        outs[-1].view(-1)[-1] = math.nan
        return outs

    plain = [d for d in kdef.domain.draws() if not d.scaled]  # the scaled ones cost minutes here
    for fake in (off_by_a_bit, unwritten):
        wrong = dataclasses.replace(kdef, launch=fake)
        res = check_config(wrong, axes, wrong.default_config, seed=1, draws=plain)
        assert not res.ok
        from kernelsearch.kernels.check import assert_correct

        with pytest.raises(WrongResult):
            assert_correct(wrong, axes, wrong.default_config, seed=1, draws=plain)


def test_timing_interpreter_is_labelled(kdef, small_axes):
    if ON_GPU:
        pytest.skip("interpreter labelling is checked without a GPU")
    inputs = kdef.make_inputs(small_axes[0], seed=2)
    t = time_call(lambda: kdef.launch(*inputs, config=kdef.default_config), n=3)
    assert t.method == WALLCLOCK and t.n == 3
    assert t.min_us <= t.median_us <= t.max_us and t.iqr_us >= 0


def test_choice_lookup_agrees_with_same_choice():
    """in_choices/_canonical look plain values up in a table; the answer is same_choice's scan."""
    from kernelsearch.kernels.spec import _canonical, in_choices, same_choice
    choice_sets = [(1, 2, True), (True, False), ("1", 1), (1.0, 2), (1, 1.0), [4, 8], (0, False)]
    for choices in choice_sets:
        for v in (1, True, False, 0, 1.0, "1", 2, 8, None):
            scan = [c for c in choices if same_choice(v, c)]
            assert in_choices(v, choices) == bool(scan), (v, choices)
            got = _canonical(v, tuple(choices))
            assert got is (scan[0] if scan else v) or (type(got), got) == (type(scan[0]), scan[0])


def test_timing_stats():
    t = Timing.of([5.0, 1.0, 3.0, 2.0, 4.0], "cupti")
    assert (t.median_us, t.min_us, t.max_us) == (3.0, 1.0, 5.0)
    assert t.q1_us == 2.0 and t.q3_us == 4.0 and t.iqr_us == 2.0
    with pytest.raises(ValueError):
        time_call(lambda: None, n=0)


def test_failures_are_typed():
    assert classify(TimeoutError("x")).kind is FailureKind.TIMEOUT
    assert classify(InvalidConfig("x")).kind is FailureKind.INVALID_CONFIG
    OutOfResources = type("OutOfResources", (Exception,), {})
    assert classify(OutOfResources("shared memory")).kind is FailureKind.OUT_OF_RESOURCES
    CompilationError = type("CompilationError", (Exception,), {})
    assert classify(CompilationError("bad")).kind is FailureKind.COMPILE_ERROR
    assert classify(RuntimeError("boom")).kind is FailureKind.CRASH
