"""`@kernelsearch.autotune`: `triton.autotune`'s signature and behaviour, with configs that come
from the shared store or the service instead of being benchmarked again in every process
(`kernelsearch.tuner`)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import triton
from triton.runtime.autotuner import Config

from kernelsearch.kernels.undeclared import Route
from kernelsearch.search_space.derived import DerivedRule

from .tuner import Autotuner


def autotune(configs: list[Config], key: list[str], prune_configs_by: dict | None = None,
             reset_to_zero: list[str] | None = None, restore_value: list[str] | None = None,
             pre_hook: Callable | None = None, post_hook: Callable | None = None,
             warmup: int | None = None, rep: int | None = None, use_cuda_graph: bool = False,
             do_bench: Callable | None = None, cache_results: bool = False, *,
             name: str | None = None,
             reference: Callable[..., Any] | None = None,
             search_space: Sequence[Config] | str | DerivedRule | None = None
             ) -> Callable[[Any], Autotuner]:
    """`triton.autotune` with the same arguments; `name` (the kernel's name in kernelsearch) and
    `reference` (what the correctness gate compares with, instead of the first config) may also
    be given to `declare`. `search_space`: more configs (the same meta-parameters) that workers
    may search besides the list, for a kernel they tune from a call's capture or a declaration,
    or "derived" / a DerivedRule for the derived space (kernelsearch.search_policy); this process
    only ever benchmarks the list."""

    def decorator(fn: Any) -> Autotuner:
        tuner = Autotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value,
                          pre_hook=pre_hook, post_hook=post_hook, prune_configs_by=prune_configs_by,
                          warmup=warmup, rep=rep, use_cuda_graph=use_cuda_graph, do_bench=do_bench,
                          cache_results=cache_results, name=name, reference=reference,
                          search_space=search_space)
        # Under the swap the module as shipped says `triton.autotune`: a worker importing it
        # must wrap the kernel itself (kernels.capture.import_tuner).
        if triton.autotune is autotune:
            tuner.reached_by = Route.SWAP
        return tuner

    return decorator
