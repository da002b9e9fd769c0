"""Kernel tests: the same checks run under the interpreter here and on the GPU where one exists."""
from __future__ import annotations

import random

import pytest
import torch

from kernelsearch import kernels
from kernelsearch.kernels.spec import KernelDef

ON_GPU = torch.cuda.is_available()

gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU; the same checks run under the interpreter")


@pytest.fixture(params=kernels.kernel_names(), ids=lambda n: n.split("_")[2])
def kdef(request) -> KernelDef:
    return kernels.get_kernel(request.param)


def _sample_configs(k: KernelDef, n: int, seed: int) -> list[dict]:
    """Random valid configs from everything the kernel accepts, plus each value of each parameter."""
    rng = random.Random(seed)
    out: list[dict] = []
    # every value of every parameter at least once, the rest at default
    for p in k.params:
        for v in p.choices:
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
        cfg = {p.name: rng.choice(p.choices) for p in k.params}
        cfg = {name: v for name, v in cfg.items() if k.param(name).active(cfg)}
        try:
            extra.append(k.validate_config(cfg))
        except ValueError:
            continue
    uniq = {tuple(sorted(c.items())): c for c in out + extra}
    return list(uniq.values())


def _small_axes(k: KernelDef) -> list[dict]:
    """Odd shapes: one row, sizes that are no multiple of any block."""
    if "seq_len" in {a.name for a in k.axes}:
        return [{"seq_len": 1}, {"seq_len": 3}, {"seq_len": 11}]
    return [{"total_patches": 1}, {"total_patches": 37}, {"total_patches": 131}]


@pytest.fixture
def sample_configs():
    return _sample_configs


@pytest.fixture
def small_axes(kdef):
    return _small_axes(kdef)
