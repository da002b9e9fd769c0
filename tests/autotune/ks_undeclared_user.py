"""A user's plain `@triton.autotune` kernel with only the decorator swapped (no declaration), for
the undeclared-kernel tests. `KS_TEST_EXTRA=1` lists one more config (a grown config list);
`KS_TEST_BEYOND=1` lets workers search one config beyond the list (`search_space=`); the
benchmark is a counting wall clock, so a test can tell whether a process benchmarked."""
from __future__ import annotations

import os
import time

import triton
import triton.language as tl

import kernelsearch

from at_env import BENCHED, counting_bench


CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=2),
           triton.Config({"BLOCK": 64}, num_warps=4)]
if os.environ.get("KS_TEST_EXTRA"):
    CONFIGS.append(triton.Config({"BLOCK": 128}, num_warps=4))


BEYOND = [triton.Config({"BLOCK": 256}, num_warps=4)] if os.environ.get("KS_TEST_BEYOND") else []


@kernelsearch.autotune(configs=CONFIGS, key=["n"], do_bench=counting_bench, search_space=BEYOND)
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2 x."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


def scale(x):
    import torch

    y = torch.empty_like(x)
    scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y


if __name__ == "__main__":
    import json
    import sys

    import torch

    from kernelsearch.backends import BACKENDS

    x = torch.randn(int(sys.argv[1]), dtype=getattr(torch, sys.argv[2]))
    torch.testing.assert_close(scale(x), 2 * x)
    # The upload of what this process tuned runs in the background: let it land.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not BACKENDS.idle():
        time.sleep(0.05)
    print(json.dumps({"sources": [s.value for s in scale_kernel.sources.values()],
                      "benched": len(BENCHED),
                      "best": scale_kernel.best_config.kwargs["BLOCK"]}))
