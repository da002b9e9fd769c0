"""A test-only kernel that says when its inputs are drawn, its reference computed and it is
launched, so tests can count them in the trial child and the compile-ahead pool.

Events go to the file named by KS_TEST_PROBE_LOG (one "pid event detail" line each; spawned
processes inherit the variable) and to `EVENTS` in this process. y = 2x, like ks_test_scale;
MODE "modify" also adds one to its input, "unwritten" leaves its output alone, "crash" exits.
PAD is a parameter the kernel ignores: it only makes the space large enough for a tuner test.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from kernelsearch import kernels
import ks_fake_kernels  # the same draws and reference as ks_test_scale
from kernelsearch.kernels.device import default_device  # noqa: F401  (tests call it from here)
from kernelsearch.kernels.spec import Axis, KernelDef, Param, runtime_of

NAME = "ks_test_probe"
LOG_ENV = "KS_TEST_PROBE_LOG"
EVENTS: list[tuple[str, str]] = []


def _event(name: str, detail: str) -> None:
    EVENTS.append((name, detail))
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {name} {detail}\n")


def read_log(path: str) -> list[tuple[int, str, str]]:
    """(pid, event, detail) of every line written so far."""
    out = []
    with open(path) as f:
        for line in f:
            pid, name, detail = line.rstrip("\n").split(" ", 2)
            out.append((int(pid), name, detail))
    return out


@triton.jit
def _double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m, other=0.0) * 2.0, mask=m)


def launch(x: torch.Tensor, *, config: Mapping[str, Any], out=None):
    mode = config["MODE"]
    _event("launch", f"n={x.numel()} MODE={mode} BLOCK={config['BLOCK']}")
    if mode == "crash":
        os._exit(3)
    y = out[0] if out is not None else torch.empty_like(x)
    if mode != "unwritten":
        n = x.numel()
        bs = config["BLOCK"]
        runtime_of(KERNEL).last_compiled = _double_kernel[(triton.cdiv(n, bs),)](x, y, n, BLOCK=bs)
    if mode == "modify":
        x.add_(1.0)
    return (y,)


def make_inputs(axes, *, seed, distribution="benchmark", device=None):
    _event("make_inputs", f"n={int(axes['n'])} seed={seed} {distribution}")
    return ks_fake_kernels.make_inputs(axes, seed=seed, distribution=distribution, device=device)


def reference(x):
    _event("reference", f"n={x.numel()}")
    return ks_fake_kernels.reference(x)


KERNEL = KernelDef(
    name=NAME, description="test-only: y = 2x, reporting its draws, references and launches",
    benchmark_problem="none", axes=(Axis("n", 1, 4096),),
    params=(Param("MODE", ("ok", "modify", "unwritten", "crash"), "ok"),
            Param("BLOCK", (16, 32, 64), 32),
            Param("PAD", tuple(range(10)), 0)),
    cases=(), input_names=("x",), output_names=("y",), rtol=1e-6,
    make_inputs=make_inputs, reference=reference, torch_reference=lambda x: (x * 2.0,),
    launch=launch, axes_of=lambda x: {"n": int(x.numel())},
    bytes_moved=lambda axes: 8 * int(axes["n"]), check_inputs=lambda x: None,
)

kernels.register(KERNEL, replace=True)
