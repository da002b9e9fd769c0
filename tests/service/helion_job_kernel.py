"""A Helion kernel that a user's process (a subprocess of the tests) and a worker (the test
process) both import by name, tuned on the CPU: its `autotuner_fn` keys the cache on the CPU
(Helion names no CPU device for its Triton backend) and searches two explicit configs."""
from __future__ import annotations

import hashlib
import inspect
import os
import textwrap
from collections.abc import Sequence

import helion
import helion.language as hl
import torch
from helion.autotuner import FiniteSearch
from helion.autotuner.base_cache import LooseAutotuneCacheKey
from helion.autotuner.local_cache import LocalAutotuneCache
from helion.autotuner.remote_cache import RemoteAutotuneCache

CONFIGS = [helion.Config(block_sizes=[4]), helion.Config(block_sizes=[8])]
SEARCHES: list[str] = []  # one entry per search this process ran


def use_cpu_timer() -> None:
    """Helion's wall-clock `do_bench_generic` in place of Triton's GPU events (no CPU driver)."""
    import helion.autotuner.benchmark_provider as bp
    from helion.autotuner.benchmarking import do_bench_generic

    bp.do_bench = do_bench_generic


class _CpuKey:
    """Helion's key with `cpu` and the interpreter where it would name the GPU and CUDA."""

    def _generate_key(self) -> LooseAutotuneCacheKey:
        k = self.kernel.kernel  # type: ignore[attr-defined]
        args = tuple(self.args)  # type: ignore[attr-defined]
        mem = k._create_bound_kernel_cache_key(self.kernel, args, k._base_specialization_key(args))  # type: ignore[attr-defined]
        source = textwrap.dedent(inspect.getsource(k.fn))
        return LooseAutotuneCacheKey(
            specialization_key=mem.specialization_key, extra_results=mem.extra_results,
            kernel_source_hash=hashlib.sha256(source.encode()).hexdigest(), hardware="cpu",
            runtime_name="triton-interpreter", backend=self.kernel.env.backend.name,  # type: ignore[attr-defined]
            config_spec_hash=self.kernel.config_spec.structural_fingerprint_hash(advanced_controls_files=None),  # type: ignore[attr-defined]
            extra_cache_key=self.kernel.extra_cache_key())  # type: ignore[attr-defined]


class CpuLocalAutotuneCache(_CpuKey, LocalAutotuneCache):
    pass


class CpuRemoteAutotuneCache(_CpuKey, RemoteAutotuneCache):
    pass


class CountingSearch(FiniteSearch):
    def _autotune(self) -> helion.Config:
        SEARCHES.append(self.kernel.kernel.name)
        return super()._autotune()


def cpu_autotuner_fn(bound: object, args: Sequence[object], **kwargs: object) -> LocalAutotuneCache:
    """Helion's default_autotuner_fn on the CPU: the cache class its `autotune_cache` names."""
    remote = bound.settings.autotune_cache == "RemoteAutotuneCache"  # type: ignore[attr-defined]
    cls = CpuRemoteAutotuneCache if remote else CpuLocalAutotuneCache
    return cls(CountingSearch(bound, args, CONFIGS))  # type: ignore[arg-type]


# In this process: no benchmark subprocess, no precompile fork (the interpreter has neither).
@helion.kernel(autotuner_fn=cpu_autotuner_fn, autotune_precompile=None,
               autotune_benchmark_subprocess=False)
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(x.size(0)):
        out[tile] = x[tile] + y[tile]
    return out


if os.environ.get("KS_TEST_HELION_CPU_TIMER"):  # a worker's job child, which the test cannot patch
    use_cpu_timer()
