"""The spaces as data: they load, respect the kernels, and never propose what a kernel rejects."""
from __future__ import annotations

import functools
import random

import optuna
import pytest

from kernelsearch import kernels
from kernelsearch.kernels.errors import InvalidConfig
from kernelsearch.search_space.safe_expr import ExprError, SafeExpr
from kernelsearch.search_space.space import SearchSpace, SpaceError, get_space, load_space

NAMES = sorted(n for n in ("vision_rope_generation_bwd", "vision_rope3d_spatial_merge_bwd"))


@functools.cache
def _grid_keys(name: str) -> list[str]:
    """The key of every grid config, in grid order (shared by the tests below: B's grid holds
    ~86,000 configs). space.key validates: it raises on any config the kernel rejects."""
    space = get_space(name)
    return [space.key(cfg) for cfg in space.grid()]


@pytest.mark.parametrize("name", NAMES)
def test_every_grid_config_passes_the_kernel(name):
    space = get_space(name)
    kdef = kernels.get_kernel(name)
    grid = space.grid()
    assert len(grid) > 100
    keys = _grid_keys(name)  # every config through the kernel's validate_config, once
    assert len(set(keys)) == len(grid), "two grid points are the same config"
    # grid() itself keeps only configs whose violation() is None; re-asked on a seeded sample
    # (every config above already passed the kernel), with the key of the canonical form.
    for cfg in random.Random(1).sample(grid, min(len(grid), 2000)):
        full = kdef.validate_config(cfg)
        assert space.violation(cfg) is None
        assert space.key(full) == space.key(cfg)


@pytest.mark.parametrize("name", NAMES)
def test_space_covers_every_tunable_dimension(name):
    space = get_space(name)
    kdef = kernels.get_kernel(name)
    searched = {p.name: p for p in space.params}
    for kp in kdef.params:
        if len(kp.choices) > 1:
            assert kp.name in searched, f"{kp.name} is not searched"
            assert len(searched[kp.name].choices) >= 2
    # Conditional parameters mirror the kernel's: TILES only with the ticket reduction, etc.
    for kp in kdef.params:
        for dep, vals in kp.requires.items():
            assert set(searched[kp.name].requires[dep]) <= set(vals)
    for cfg in random.Random(0).sample(space.grid(), 500):
        for kp in kdef.params:
            if kp.name in cfg:
                assert kp.active(kdef.validate_config(cfg))


def test_issue_dimensions_are_present():
    a = get_space("vision_rope_generation_bwd")
    b = get_space("vision_rope3d_spatial_merge_bwd")
    assert {"BLOCK_P", "TILES", "REDUCE", "COLS", "PIPELINE", "TRIG", "num_warps",
            "num_stages"} <= set(a.names)
    assert {"ROWS", "HEADS", "BLOCK_D", "GRID", "PROGRAMS_PER_SM", "CACHE", "TRIG",
            "num_warps", "num_stages"} <= set(b.names)
    assert a.param("TILES").requires == {"REDUCE": ("ticket", "ticket2", "fixed", "hybrid"),
                                         "GRID": ("tiles",)}
    assert a.param("PROGRAMS_PER_SM").requires["GRID"] == ("persistent",)
    assert b.param("PROGRAMS_PER_SM").requires == {"GRID": ("persistent",)}
    assert a.param("BLOCK_P").choices == (8, 16, 32, 64, 128, 256, 512)  # expanded from a pow2 range


def test_spaces_leave_out_what_the_domain_always_rejects():
    """Unreduced fast sin/cos fails the domain's largest angles on the GPU: never searched."""
    for name in NAMES:
        space = get_space(name)
        assert "approx" not in space.param("TRIG").choices
        assert all(cfg.get("TRIG") != "approx" for cfg, _ in space.seeds)


def test_constraints_reject_with_their_message():
    a = get_space("vision_rope_generation_bwd")
    bad = {"BLOCK_P": 256, "REDUCE": "ticket", "GRID": "tiles", "TILES": 4, "COLS": "quarters", "TRIG": "precise",
           "num_warps": 1, "num_stages": 1}
    msg = a.violation(bad)
    assert msg and "registers" in msg
    assert all(not (c["BLOCK_P"] == 256 and c["num_warps"] == 1) for c in a.grid())
    b = get_space("vision_rope3d_spatial_merge_bwd")
    assert "only applies" in b.violation({"GRID": "tiles", "PROGRAMS_PER_SM": 2})
    assert "outside the search space" in b.violation({"CACHE": "bogus"})
    assert all("PROGRAMS_PER_SM" not in c for c in b.grid() if c["GRID"] == "tiles")


@pytest.mark.parametrize("name", NAMES)
def test_params_round_trip_and_suggest_stays_in_the_space(name):
    space = get_space(name)
    grid = space.grid()
    rng = random.Random(0)
    for cfg in rng.sample(grid, 50):
        assert space.config_of(space.to_params(cfg)) == cfg
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    valid = 0
    for _ in range(60):
        trial = study.ask()
        cfg = space.suggest(trial)
        for k, v in cfg.items():
            assert v in space.param(k).choices
        valid += space.violation(cfg) is None
        study.tell(trial, 1.0)
    assert valid > 0
    # An enqueued config comes back unchanged through suggest.
    pick = grid[len(grid) // 2]
    study.enqueue_trial(space.to_params(pick))
    assert space.suggest(study.ask()) == pick


@pytest.mark.parametrize("name", NAMES)
def test_grid_is_every_enumerated_config_that_violation_accepts(name):
    """grid() takes shortcuts (no parameter checks, constraint verdicts kept per value): it must
    keep exactly the configs violation() accepts, in enumeration order."""
    space = get_space(name).reduced()
    everything = list(space._enumerate())
    assert space.grid() == [c for c in everything if space.violation(c) is None]
    assert 0 < len(space.grid()) < len(everything)  # the constraints do reject some


def test_reduced_space_is_a_subset():
    space = get_space("vision_rope3d_spatial_merge_bwd")
    red = space.reduced()
    keys = set(_grid_keys("vision_rope3d_spatial_merge_bwd"))
    assert 20 < red.size() < 400
    assert all(space.key(c) in keys for c in red.grid())


@pytest.mark.parametrize("doc, needle", [
    ({"param": [{"name": "NOPE", "choices": [1]}]}, "unknown parameter"),
    ({"param": [{"name": "BLOCK_P", "choices": [7]}]}, "not accepted by the kernel"),
    ({"param": [{"name": "TILES", "choices": [1, 2]}]}, "must require REDUCE"),
    ({"param": [{"name": "BLOCK_P", "range": {"low": 9, "high": 3}}]}, "empty"),
    ({"param": [{"name": "BLOCK_P", "choices": [8]}],
      "constraint": [{"expr": "__import__('os').system('x')", "message": "m"}]}, "not allowed"),
    ({"param": [{"name": "BLOCK_P", "choices": [8]}],
      "constraint": [{"expr": "BLOCK_P.real > 0", "message": "m"}]}, "not allowed"),
    ({"param": [{"name": "BLOCK_P", "choices": [8]}],
      "constraint": [{"expr": "WARPS > 0", "message": "m"}]}, "unknown parameter"),
])
def test_bad_space_files_fail_clearly(doc, needle):
    with pytest.raises(SpaceError, match=needle):
        SearchSpace.from_dict(doc, kernels.get_kernel("vision_rope_generation_bwd"))


def test_safe_expr():
    e = SafeExpr("a * 2 <= max(b, 3) and c in ('x', 'y')")
    assert e.names == {"a", "b", "c"}
    assert e.evaluate({"a": 1, "b": 1, "c": "x"}) is True
    assert e.evaluate({"a": 4, "b": 1, "c": "x"}) is False
    with pytest.raises(ExprError):
        e.evaluate({"a": 1})
    for bad in ("(lambda: 1)()", "a[0]", "open('f')", "2 ** 1000"):
        with pytest.raises(ExprError):
            SafeExpr(bad).evaluate({"a": [1]})


def test_unknown_kernel_and_invalid_enqueue():
    with pytest.raises(SpaceError, match="no search space|unknown kernel"):
        load_space("no_such_kernel")
    b = get_space("vision_rope3d_spatial_merge_bwd")
    with pytest.raises(InvalidConfig):
        b.to_params({"ROWS": 1, "HEADS": 16, "BLOCK_D": 64, "CACHE": "none", "TRIG": "precise",
                     "num_warps": 4, "GRID": "tiles", "num_stages": 3})


def test_a_relative_toml_space_is_read_next_to_the_declaring_module(tmp_path, monkeypatch):
    """`space="spaces/x.toml"` means the file beside the kernel's module, from any working
    directory; a missing one is a SpaceError naming the path it looked at."""
    import importlib
    import sys

    from kernelsearch.kernels.registry import unregister

    pkg = tmp_path / "decl"
    (pkg / "spaces").mkdir(parents=True)
    (pkg / "spaces" / "rel.toml").write_text(
        'kernel = "ks_toml_rel"\n[[param]]\nname = "MODE"\nchoices = ["ok"]\n'
        '[[param]]\nname = "BLOCK"\nchoices = [16, 32]\nordinal = true\n')
    (pkg / "ks_toml_rel_mod.py").write_text(
        "import dataclasses\nimport ks_fake_kernels\nfrom kernelsearch.kernels import register\n"
        "KERNEL = register(dataclasses.replace(ks_fake_kernels.KERNEL, name='ks_toml_rel', "
        "space='spaces/rel.toml', module=__name__))\n"
        "MISSING = register(dataclasses.replace(ks_fake_kernels.KERNEL, name='ks_toml_missing', "
        "space='spaces/nope.toml', module=__name__))\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.chdir(elsewhere)
    importlib.import_module("ks_toml_rel_mod")
    try:
        space = load_space("ks_toml_rel")
        assert space.names == ("MODE", "BLOCK") and space.param("BLOCK").choices == (16, 32)
        with pytest.raises(SpaceError) as err:
            load_space("ks_toml_missing")
        assert str(pkg.resolve() / "spaces" / "nope.toml") in str(err.value)
    finally:
        unregister("ks_toml_rel")
        unregister("ks_toml_missing")
        sys.modules.pop("ks_toml_rel_mod", None)


def test_a_study_holding_other_choices_gets_the_changed_params_renamed():
    """Optuna refuses to change a parameter's choices within a study: a space changed since the
    study began asks its changed parameters as NAME[<fingerprint>], the rest as before."""
    space = get_space("vision_rope_generation_bwd")
    held = {p.name: p.distribution() for p in space.params}
    assert space.for_study(held) is space
    first = space.params[0]
    held[first.name] = optuna.distributions.CategoricalDistribution(list(first.choices[:1]) + ["x"])
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(params={first.name: "x"},
                                              distributions={first.name: held[first.name]}, value=1.0))
    moved = space.for_study(held)
    assert [p.optuna_name for p in moved.params] == (
        [f"{first.name}[{space.fingerprint}]"] + [p.name for p in space.params[1:]])
    suggested = moved.suggest(study.ask())
    assert set(suggested) <= set(space.names) and first.name in suggested
    cfg = space.canonical(space.kernel.default_config)  # a valid config (a suggestion may not be)
    assert moved.config_of(moved.to_params(cfg)) == cfg
