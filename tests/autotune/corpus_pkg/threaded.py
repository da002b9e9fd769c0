"""A serving engine's pattern: one kernel called from several threads at once, over two keys.
The engine warms each key in one thread first, as vLLM's start-up does: Triton's own autotuner
cannot take a new key from two threads at once (its `nargs` are shared; TypeError)."""
from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
@triton.jit
def _rms_scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, x * 0.5 - 1.0, mask=m)


def run() -> dict[str, torch.Tensor]:
    sizes = [64, 100, 64, 100, 64, 100]
    xs = [inputs(20 + i, n) for i, n in enumerate(sizes)]
    ys = [torch.empty_like(x) for x in xs]
    for n in (64, 100):  # the warm-up, one thread
        _rms_scale_kernel[grid1d(n)](inputs(19, n), torch.empty(n), n)
    errors: list[BaseException] = []
    start = threading.Barrier(len(sizes))

    def call(i: int) -> None:
        try:
            start.wait()
            _rms_scale_kernel[grid1d(sizes[i])](xs[i], ys[i], sizes[i])
        except BaseException as exc:  # the main thread re-raises it, as a caller would see it
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(sizes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {f"y{i}": y for i, y in enumerate(ys)}
