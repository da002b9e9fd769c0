"""The compile-ahead pool's side of the runner: what each pool process runs (`_compile_init`,
`_warm_worker`, `compile_config`) on shaped inputs kept per case."""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from kernelsearch.kernels.registry import get_kernel
from kernelsearch.kernels.spec import config_key

from .trial_child import _import_modules, _tiny_launch


def _compile_init(modules: Sequence[str], optional: Sequence[str] = ()) -> None:
    """Runs once in each pool process: imports, the CUDA context, launches turned into warmups."""
    _import_modules(modules, optional)
    import torch

    from kernelsearch.kernels.device import default_device

    from ._triton_private import launches_become_warmups

    # One compile per process at a time: torch's intra-op threads would only oversubscribe the
    # cores the other workers and the trial child use.
    torch.set_num_threads(1)
    device = default_device()
    if device.type == "cuda":
        torch.empty(1, device=device)
    launches_become_warmups()


def _warm_worker() -> int:
    """The first task of each pool process: starting the pool submits one per worker, so every
    process is spawned (and its initializer run) before the first config is submitted."""
    _tiny_launch()
    return os.getpid()


# Per pool process: uninitialised tensors shaped like a case's inputs, for the latest two cases
# (the one being tuned and the next one being prefetched).
_SHAPED: "OrderedDict[tuple[str, str], tuple[Any, ...]]" = OrderedDict()
_SHAPED_CASES = 2


def _shaped_inputs(kernel: Any, axes: Mapping[str, int]) -> tuple[Any, ...]:
    """`KernelDef.empty_inputs` on the GPU, kept per case and process; on the CPU (interpreter)
    a real draw, since there the launch runs for real."""
    from kernelsearch.kernels.device import default_device

    key = (kernel.name, config_key(axes))
    got = _SHAPED.get(key)
    if got is not None:
        _SHAPED.move_to_end(key)
        return got
    device = default_device()
    if device.type == "cuda":
        got = kernel.empty_inputs(axes, device)
    else:
        got = kernel.make_inputs(axes, seed=0, distribution="benchmark", device="cpu")
    _SHAPED[key] = got
    while len(_SHAPED) > _SHAPED_CASES:
        _SHAPED.popitem(last=False)
    return got


def compile_config(kernel_name: str, axes: Mapping[str, int], config: Mapping[str, Any]) -> float:
    """Compile one config for one case by launching it on shaped inputs (in a pool process whose
    launches are warmups, or on garbage data, never timed); the seconds it took. Raises what
    validation or the compiler raised."""
    kernel = get_kernel(kernel_name)
    t0 = time.perf_counter()
    cfg = kernel.validate_config(config)
    kernel.launch(*_shaped_inputs(kernel, axes), config=cfg)
    return time.perf_counter() - t0


def _key(kernel: str, axes: Mapping[str, int], config: Mapping[str, Any]) -> tuple[str, str, str]:
    return kernel, config_key(axes), config_key(config)


__all__ = ["compile_config"]
