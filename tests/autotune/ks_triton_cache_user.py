"""A user's plain `@triton.autotune(cache_results=True)` kernel, unchanged: only
TRITON_CACHE_MANAGER points at kernelsearch. For the cache manager's tests.

Under the interpreter Triton turns `cache_results` off, and the CPU has no driver whose target
`check_disk_cache` hashes into an entry's key: `stand_in_target` turns it back on over a fixed
target, so Triton's own disk-cache code runs here as on a GPU (the interpreter runs the kernel).
The benchmark is a counting wall clock, so a test can tell whether a process benchmarked."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from at_env import BENCHED, counting_bench  # noqa: E402


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1),
                          triton.Config({"BLOCK": 32}, num_warps=2),
                          triton.Config({"BLOCK": 64}, num_warps=4)],
                 key=["n"], do_bench=counting_bench, cache_results=True)
@triton.jit
def triple_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 3 x."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 3.0, mask=m)


def triple(x):
    import torch

    y = torch.empty_like(x)
    triple_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y


def stand_in_target() -> None:
    """Give Triton's check_disk_cache a target to hash on a machine with no GPU driver."""
    import triton.compiler.compiler as compiler
    import triton.runtime.autotuner as autotuner

    class _Backend:
        def hash(self) -> str:
            return "interpreter"

    class _Active:
        def get_current_target(self) -> str:
            return "interpreter"

    class _Driver:
        active = _Active()

    import hashlib
    import inspect

    from triton.runtime.interpreter import InterpretedFunction

    # Under the interpreter the kernel is an InterpretedFunction, which has no JIT cache key.
    autotuner.JITFunction = InterpretedFunction
    if not hasattr(InterpretedFunction, "cache_key"):
        InterpretedFunction.cache_key = property(  # type: ignore[attr-defined]
            lambda self: hashlib.sha256(inspect.getsource(self.fn).encode()).hexdigest())
    autotuner.driver = _Driver()
    compiler.make_backend = lambda target: _Backend()
    triple_kernel.cache_results = True


if __name__ == "__main__":
    import json
    import sys

    import torch

    stand_in_target()
    x = torch.randn(int(sys.argv[1]))
    torch.testing.assert_close(triple(x), 3 * x)
    from kernelsearch.backends import BACKENDS
    from kernelsearch.triton_cache import STATS

    BACKENDS.drain(20)
    print(json.dumps({"benched": len(BENCHED), "served": STATS.served, "shared": STATS.shared,
                      "best": triple_kernel.best_config.kwargs["BLOCK"]}))
