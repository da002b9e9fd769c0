"""Kernel tests: the same checks run under the interpreter here and on the GPU where one exists."""
from __future__ import annotations

import random
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from kernelsearch import kernels
from kernelsearch.kernels.spec import LAUNCH_OPTIONS, KernelDef

# The contract suite runs against every registered kernel: the built-ins (entry points) and a
# user's kernel written only against the public API, as any plugin would be.
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))
kernels.registry.load_module("ks_user_axpy")
# The matmul example as its package declares it (installed or not, the suite always covers it).
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "matmul"
if str(EXAMPLE) not in sys.path:
    sys.path.append(str(EXAMPLE))
kernels.registry.load_module("ks_matmul_example.declaration")

ON_GPU = torch.cuda.is_available()
# Choices a kernel accepts that the correctness gate never certifies on its whole input domain
# (the RoPE kernels' unreduced fast sin/cos: test_domain.py shows the gate refusing it; the search
# spaces leave it out): sampled configs never hold them.
UNCERTIFIED = {"TRIG": ("approx",)}

gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU; the same checks run under the interpreter")


# Every kernel a user could install or declare: the entry points' and the two plugins above
# (not the test-only kernels other test modules register in the same process).
CONTRACT_KERNELS = sorted({ep.name for ep in entry_points(group=kernels.registry.ENTRY_POINT_GROUP)}
                          | {"ks_user_axpy", "triton_tutorial_matmul"})


@pytest.fixture(params=CONTRACT_KERNELS, ids=lambda n: n)
def kdef(request) -> KernelDef:
    return kernels.get_kernel(request.param)


def _sample_configs(k: KernelDef, n: int, seed: int) -> list[dict]:
    """Random valid configs from everything the kernel accepts, plus each value of each parameter."""
    rng = random.Random(seed)
    out: list[dict] = []
    # every value of every parameter at least once, the rest at default
    for p in k.params:
        for v in p.choices:
            if v in UNCERTIFIED.get(p.name, ()):
                continue  # accepted, but the gate never certifies it on the whole domain
            cfg = dict(k.default_config)
            for q in k.params:
                if q.requires and not q.active({**cfg, p.name: v}):
                    cfg.pop(q.name, None)
            for dep, vals in p.requires.items():
                cfg[dep] = vals[0]
            cfg[p.name] = v
            try:
                out.append(k.validate_config(cfg))
            except ValueError:
                continue
    tries = 0
    extra: list[dict] = []
    while len(extra) < n and tries < 50 * n:
        tries += 1
        cfg = {p.name: rng.choice([c for c in p.choices if c not in UNCERTIFIED.get(p.name, ())])
               for p in k.params}
        cfg = {name: v for name, v in cfg.items() if k.param(name).active(cfg)}
        try:
            extra.append(k.validate_config(cfg))
        except ValueError:
            continue
    if k.space is not None and not isinstance(k.space, (str, Path)):
        # A declared config list is the whole space: every one of them.
        from kernelsearch.kernels.spec import from_triton_config

        out += [k.validate_config(c if isinstance(c, dict) else from_triton_config(c)) for c in k.space]
    uniq = {tuple(sorted(c.items())): c for c in out + extra}
    return list(uniq.values())


def _interpreter_cost(k: KernelDef, cfg: dict) -> float:
    """A guess at a config's cost under the interpreter, which pays per program: the smaller its
    integer meta-parameters (block sizes and the like), the more programs."""
    cost = 1.0
    for p in k.params:
        if p.name in cfg and p.name not in LAUNCH_OPTIONS and all(type(c) is int and c > 0 for c in p.choices):
            cost *= max(p.choices) / cfg[p.name]
    return cost


def _covering_configs(k: KernelDef) -> list[dict]:
    """Few cheap valid configs that hold every value of every parameter between them (a covering
    design): a greedy cover, by new values per unit of `_interpreter_cost`, picked from the
    one-value-at-a-time configs of `_sample_configs`, cycles (config i takes each parameter's
    i-th value, one conditional parameter's requirements set in turn) and seeded random ones."""
    def served(p) -> list:
        return [c for c in p.choices if c not in UNCERTIFIED.get(p.name, ())]

    def valid(cfg: dict) -> dict | None:
        cfg = {name: v for name, v in cfg.items() if k.param(name).active(cfg)}
        try:
            return k.validate_config(cfg)
        except ValueError:
            return None

    wanted = {(p.name, v) for p in k.params for v in served(p)}
    cands = _sample_configs(k, n=0, seed=0)
    cond = [p for p in k.params if p.requires] or [None]
    rng = random.Random(0)
    for i in range(max(len(served(p)) for p in k.params) * len(cond) * 4):
        if i % 4 == 0:
            cfg = {p.name: served(p)[i // 4 % len(served(p))] for p in k.params}
        else:
            cfg = {p.name: rng.choice(served(p)) for p in k.params}
        p = cond[i % len(cond)]  # conditional parameters take turns to have their requirements
        if p is not None:
            cfg.update({dep: vals[0] for dep, vals in p.requires.items() if cfg[dep] not in vals})
        c = valid(cfg)
        if c is not None:
            cands.append(c)
    for name, v in sorted(wanted, key=str):  # a value valid only beside others: random company
        for _ in range(200):
            if any(c.get(name) == v for c in cands):
                break
            cfg = {p.name: rng.choice(served(p)) for p in k.params}
            cfg[name] = v
            cfg.update({dep: vals[0] for dep, vals in k.param(name).requires.items()})
            c = valid(cfg)
            if c is not None:
                cands.append(c)
    out: list[dict] = []
    while wanted:
        best = max(cands, key=lambda c: len(wanted & set(c.items())) / _interpreter_cost(k, c))
        assert wanted & set(best.items()), f"{k.name}: no valid config holds {sorted(wanted, key=str)}"
        out.append(best)
        wanted -= set(best.items())
    if k.space is not None and not isinstance(k.space, (str, Path)):
        # A declared config list is the whole space: every one of them.
        from kernelsearch.kernels.spec import from_triton_config

        out += [k.validate_config(c if isinstance(c, dict) else from_triton_config(c)) for c in k.space]
    return list({tuple(sorted(c.items())): c for c in out}.values())


def _small_axes(k: KernelDef) -> list[dict]:
    """Odd shapes from the declaration alone: the smallest size, then sizes that are no multiple
    of any block; categorical axes take each of their values in turn."""
    out = []
    for i, extra in enumerate((0, 2, 36)):
        axes = {}
        for a in k.axes:
            axes[a.name] = a.choices[i % len(a.choices)] if a.categorical else min(a.minimum + extra,
                                                                                    a.maximum)
        out.append(k.validate_axes(axes))
    return out


@pytest.fixture
def sample_configs():
    return _sample_configs


@pytest.fixture
def covering_configs():
    return _covering_configs


@pytest.fixture
def small_axes(kdef):
    return _small_axes(kdef)
