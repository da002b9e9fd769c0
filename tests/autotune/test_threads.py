"""Threads calling one decorated kernel at once: each call's hooks see that call's tensors."""
from __future__ import annotations

import threading

import pytest
import torch
import triton
import triton.language as tl

import kernelsearch

pytestmark = [pytest.mark.tune_default, pytest.mark.usefixtures("isolated_client")]


@kernelsearch.autotune(configs=[triton.Config({"B": 32}), triton.Config({"B": 64})],
                       key=["n"], restore_value=["y_ptr"])
@triton.jit
def _axpy_in_place(x_ptr, y_ptr, n, alpha, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    m = offs < n
    y = tl.load(y_ptr + offs, mask=m)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * alpha + y, mask=m)


def test_threads_tuning_one_kernel_each_get_their_own_result() -> None:
    """Triton's Autotuner keeps a call's arguments on itself, so two threads tuning at once
    restored each other's `y` (and the second failed inside kernelsearch); calls now take turns."""
    errors: list[BaseException] = []

    def call(n: int, seed: int) -> None:
        try:
            g = torch.Generator().manual_seed(seed)
            x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
            want = x * 0.5 + y
            _axpy_in_place[lambda a: (triton.cdiv(n, a["B"]),)](x, y, n, 0.5)
            torch.testing.assert_close(y, want)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(n, i)) for i, n in enumerate((100, 300, 100, 300))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
