"""A plausible tuned record to seed a database with (the values matter only for lookups)."""
from __future__ import annotations

from typing import Any


def a_record(kernel: str, axes: dict[str, int], device: str, latency_us: float = 10.0,
             config: dict[str, Any] | None = None) -> Any:
    from kernelsearch import kernels
    from kernelsearch.db.views import RecordIn

    k = kernels.get_kernel(kernel)
    return RecordIn(
        kernel=kernel, axes=dict(axes), work=float(k.bytes_moved(axes)), device=device,
        torch_version="2.11.0", triton_version="3.6.0", source_hash=k.source_hash,
        config=dict(config or k.default_config), latency_median_us=latency_us,
        latency_min_us=latency_us * 0.9, latency_max_us=latency_us * 1.2,
        latency_iqr_us=latency_us * 0.05, timing_method="cupti", rel_error=1e-7, n_trials=10)
