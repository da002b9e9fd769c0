"""A user's well-behaved `@kernelsearch.autotune` kernel (y = 2x), the good job the poison-module
tests queue behind a poison one: cheap to tune from a capture under the interpreter."""
from __future__ import annotations

import triton
import triton.language as tl

import kernelsearch


@kernelsearch.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1)], key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


def _stall(args: dict) -> None:
    """A launch that never ends within a test: the job's wall-clock bound must end it."""
    import time

    time.sleep(120)


@kernelsearch.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1, pre_hook=_stall)], key=["n"])
@triton.jit
def stalling_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)
