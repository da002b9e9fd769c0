"""Issue 25 on the H200: `torch.compile` of a function calling an `@kernelsearch.autotune` kernel
(a row softmax, 8 configs, plain Triton code) runs the served config.

  share      eager, fresh process: tunes here and shares through the service (KS_SERVICE_URL)
  compiled   torch.compile, fresh process and Triton/Inductor caches: the config comes from the
             service at trace time (early_config_prune); Inductor benchmarks nothing
  baseline   the same code under plain triton.autotune, compiled: Inductor tunes every config
             (gpu.sh turns Inductor's Redis autotune cache on: TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=1)
  baseline-second   the same on a second host (fresh Inductor and Triton caches, the same Redis)

Each prints one JSON line: time from the first call to its result, the config the kernel ran,
where it came from, and the largest difference from the eager torch.softmax.

    python3 issue25_compile.py share|compiled|baseline|baseline-second
"""
from __future__ import annotations

import json
import sys
import time


def main(mode: str) -> None:
    import torch
    import triton
    import triton.language as tl

    import kernelsearch

    deco = triton.autotune if mode.startswith("baseline") else kernelsearch.autotune
    configs = [triton.Config({"BLOCK_M": m}, num_warps=w) for m in (1, 2, 4, 8) for w in (4, 8)]

    @deco(configs=configs, key=["n_rows", "n_cols"])
    @triton.jit
    def softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        m = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=m,
                    other=-float("inf")).to(tl.float32)
        x = x - tl.max(x, axis=1)[:, None]
        e = tl.exp(x)
        y = e / tl.sum(e, axis=1)[:, None]
        tl.store(y_ptr + rows[:, None] * n_cols + cols[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=m)

    def softmax(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n_rows, n_cols = x.shape
        softmax_kernel[lambda meta: (triton.cdiv(n_rows, meta["BLOCK_M"]),)](
            x, y, n_rows, n_cols, BLOCK_N=triton.next_power_of_2(n_cols))
        return y

    def f(x: torch.Tensor) -> torch.Tensor:
        return softmax(x * 2.0) + 1.0

    x = torch.randn(8192, 2048, device="cuda", dtype=torch.float16)
    run = f if mode == "share" else torch.compile(f, fullgraph=True)
    t0 = time.perf_counter()
    out = run(x)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ref = torch.softmax(x.float() * 2.0, dim=-1) + 1.0
    if mode == "share":
        from kernelsearch.backends import BACKENDS

        BACKENDS.drain(30)
    sources = {str(k): v.value for k, v in getattr(softmax_kernel, "sources", {}).items()}
    best = getattr(softmax_kernel, "best_config", None)
    print(json.dumps({"mode": mode, "first_call_s": round(first, 3),
                      "max_abs_err": float((out.float() - ref).abs().max()),
                      "sources": sources, "best": None if best is None else str(best)}))


if __name__ == "__main__":
    main(sys.argv[1])
