"""A test-only kernel whose configs misbehave on purpose: wrong results, crashes, hangs.

Importing this module registers it in the kernel registry; the trial runner imports it in its
child process through `TrialRunner(kernel_modules=["ks_fake_kernels"])`. Nothing in kernels/ is
edited: it is a real Triton kernel (y = FACTOR * x) declared through the same KernelDef.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from kernelsearch import kernels
from kernelsearch.kernels.device import default_device
from kernelsearch.kernels.errors import CompileError
from kernelsearch.kernels.spec import Axis, KernelDef, Param, runtime_of

NAME = "ks_test_scale"
# Seconds a compile-pool process sleeps while importing this module: a pool that is slow to
# start, as a 15-worker pool on a shared GPU host is (torch, CUDA context, Triton per worker).
SLOW_POOL_ENV = "KS_TEST_SLOW_POOL_START_S"
if mp.current_process().name not in ("MainProcess", "ks-trial-runner"):
    time.sleep(float(os.environ.get(SLOW_POOL_ENV, "0") or 0))


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, FACTOR: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m, other=0.0) * FACTOR, mask=m)


def launch(x: torch.Tensor, *, config: Mapping[str, Any], out=None):
    mode = config["MODE"]
    stop_once = os.environ.get("KS_FAKE_SIGSTOP_WORKER_ONCE")
    if stop_once and not os.path.exists(stop_once):
        # Hostile code stopping the worker that runs it (its parent), once per marker file.
        with open(stop_once, "w") as fh:
            fh.write(str(os.getppid()))
        os.kill(os.getppid(), signal.SIGSTOP)
    if mode == "crash":
        os._exit(3)  # what a segfaulting candidate looks like from the parent
    if mode == "hang":
        time.sleep(3600)
    if mode == "slow":
        time.sleep(1.0)
    if mode == "compile_error":
        raise CompileError("ks_test_scale: MODE=compile_error refuses to compile")
    y = out[0] if out is not None else torch.empty_like(x)
    n = x.numel()
    bs = config["BLOCK"]
    runtime_of(KERNEL).last_compiled = _scale_kernel[(triton.cdiv(n, bs),)](
        x, y, n, BLOCK=bs, FACTOR=3.0 if mode == "wrong" else 2.0)
    return (y,)


def make_inputs(axes, *, seed, distribution="benchmark", device=None):
    device = torch.device(device) if device is not None else default_device()
    n = int(axes["n"])
    gen = torch.Generator().manual_seed(seed)
    if distribution == "benchmark":
        x = torch.randn(n, generator=gen)
    elif distribution == "realistic":
        x = torch.arange(n, dtype=torch.float32) / max(n, 1)
    else:
        raise ValueError(f"distribution: unknown {distribution!r}")
    return (x.to(device),)


def reference(x):
    return (x.double() * 2.0,)


KERNEL = KernelDef(
    name=NAME, description="test-only: y = 2x, with configs that fail on purpose",
    benchmark_problem="none", axes=(Axis("n", 1, 4096),),
    params=(Param("MODE", ("ok", "wrong", "crash", "hang", "slow", "compile_error"), "ok"),
            Param("BLOCK", (16, 32, 64), 32)),
    cases=(), input_names=("x",), output_names=("y",), rtol=1e-6,
    make_inputs=make_inputs, reference=reference, torch_reference=lambda x: (x * 2.0,),
    launch=launch, axes_of=lambda x: {"n": int(x.numel())},
    bytes_moved=lambda axes: 8 * int(axes["n"]), check_inputs=lambda x: None,
)

kernels.register(KERNEL, replace=True)
