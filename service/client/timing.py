"""Timings as the decorator reads them: a wall-clock benchmark for the interpreter (no GPU
benchmarker there) and a benchmark answer as [median, p20, p80] in ms."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from kernelsearch.kernels.measure import wallclock_us


def quantiles(t: Any) -> list[float]:
    """A do_bench answer as [median, p20, p80] in ms (a user's do_bench may give one number)."""
    if isinstance(t, (int, float)):
        return [float(t)] * 3
    vals = [float(x) for x in t]
    return (vals + [vals[0]] * 3)[:3]


def wallclock_bench(kernel_call: Callable[[], Any], quantiles: Sequence[float] = (0.5, 0.2, 0.8),
                    n: int = 5) -> list[float]:
    """Triton's `do_bench` answer (the asked `quantiles` of the times, in ms) by
    `kernels.measure`'s wall clock: the interpreter has no GPU benchmarker."""
    s = sorted(us / 1e3 for us in wallclock_us(kernel_call, n))
    return [_quantile(s, q) for q in quantiles]


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile of sorted values, linearly interpolated (numpy's default, as do_bench)."""
    pos = min(max(q, 0.0), 1.0) * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
