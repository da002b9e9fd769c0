"""The searched winner against the list's best, re-measured in one run before it is served.

A search's pick is one noisy measurement among many (the best of N noisy draws is biased low:
on the H200 a wider run's pick at M=64 was 2.5x slower than the list's best, docs/perf-notes.md).
So the two are timed again, interleaved (list, search, list, search, ...: drift in clocks or
temperature hits both alike), `repeats` calls each, and the searched one is served only when the
median speedup (list time over searched time) is above 1 with confidence: the lower end of a
bootstrap confidence interval of the ratio of medians is above `min_gain`.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

DEFAULT_REPEATS = 40
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 2000


@dataclass(frozen=True)
class Verdict:
    """The re-measure's decision: `serve_searched`, the median speedup of the searched config over
    the list's best, and its confidence interval."""

    serve_searched: bool
    speedup: float
    low: float
    high: float
    list_median_us: float
    searched_median_us: float
    n: int

    @property
    def gain(self) -> float:
        """What the record stores as the gain vs the list's best: the speedup when served, 1.0
        when the list's best is served."""
        return self.speedup if self.serve_searched else 1.0


def interleaved(time_list: Callable[[], float], time_searched: Callable[[], float],
                repeats: int = DEFAULT_REPEATS) -> tuple[list[float], list[float]]:
    """Per-call times of both configs, taken alternately (ABAB...), `repeats` each."""
    if repeats < 2:
        raise ValueError(f"repeats: expected >= 2, got {repeats}")
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeats):
        a.append(float(time_list()))
        b.append(float(time_searched()))
    return a, b


def decide(list_times: Sequence[float], searched_times: Sequence[float], *,
           confidence: float = DEFAULT_CONFIDENCE, n_boot: int = DEFAULT_BOOTSTRAP,
           min_gain: float = 1.0, seed: int = 0) -> Verdict:
    """Serve the searched config only when the bootstrap interval of median(list) /
    median(searched) lies above `min_gain` at `confidence` (one-sided: its lower end)."""
    a = np.asarray(list_times, dtype=float)
    b = np.asarray(searched_times, dtype=float)
    if a.size < 2 or b.size < 2:
        raise ValueError("times: expected at least 2 per-call times of each config")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and a.min() > 0 and b.min() > 0):
        raise ValueError("times: expected finite positive per-call times")
    if not 0.5 < confidence < 1:
        raise ValueError(f"confidence: expected in (0.5, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    ra = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    ratios = ra / rb
    low = float(np.quantile(ratios, 1 - confidence))
    high = float(np.quantile(ratios, confidence))
    ma, mb = statistics.median(a.tolist()), statistics.median(b.tolist())
    speedup = ma / mb
    return Verdict(serve_searched=bool(low > min_gain and speedup > min_gain), speedup=speedup,
                   low=low, high=high, list_median_us=ma, searched_median_us=mb,
                   n=int(min(a.size, b.size)))


def remeasure(time_list: Callable[[], float], time_searched: Callable[[], float], *,
              repeats: int = DEFAULT_REPEATS, confidence: float = DEFAULT_CONFIDENCE,
              seed: int = 0) -> Verdict:
    """Time both interleaved and decide (`interleaved`, `decide`)."""
    a, b = interleaved(time_list, time_searched, repeats)
    return decide(a, b, confidence=confidence, seed=seed)


__all__ = ["Verdict", "interleaved", "decide", "remeasure", "DEFAULT_REPEATS"]
