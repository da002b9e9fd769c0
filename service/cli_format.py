"""How the CLI prints a latency: in the unit that fits the number (ns, us, ms, s).

Latencies are kept in microseconds everywhere; under the Triton interpreter a trial takes
seconds, and `1642731.05 us` reads as a typo. One formatter, so every command agrees.
"""
from __future__ import annotations

import math

_UNITS = ((1e6, "s"), (1e3, "ms"), (1.0, "us"), (1e-3, "ns"))


def format_latency(us: float | None) -> str:
    """`us` microseconds as e.g. `1.64 s`, `12.35 us`, `830.00 ns`; `-` for None or not finite."""
    if us is None or not math.isfinite(us):
        return "-"
    for scale, unit in _UNITS:
        if round(abs(us) / scale, 2) >= 1.0:  # 999.999 us prints as 1.00 ms, not 1000.00 us
            return f"{us / scale:.2f} {unit}"
    return f"{us * 1e3:.2f} ns"
