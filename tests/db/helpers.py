"""Small builders shared by the db tests (and importable by spawned race processes)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from kernelsearch.db.views import RecordIn
from kernelsearch.kernels import get_kernel

KERNEL = "vision_rope_generation_bwd"
DEVICE = "NVIDIA H200"
T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


def _work(kernel: str, axes: dict[str, Any], size: int) -> float:
    """The kernel's own `work` of the case, as the gate holds a record to; a made-up one for a
    kernel not registered or a case it cannot size."""
    try:
        return float(get_kernel(kernel).work(axes))
    except Exception:  # noqa: BLE001 - made-up kernels and axes of the store's own tests
        return float(size * 880)


def make_record(
    latency: float,
    *,
    axes: dict[str, int] | None = None,
    work: float | None = None,
    kernel: str = KERNEL,
    device: str = DEVICE,
    minutes: float = 0.0,
    config: dict[str, Any] | None = None,
    **extra: Any,
) -> RecordIn:
    """A plausible record; `minutes` shifts tuned_at so records differ in time."""
    axes = axes if axes is not None else {"total_patches": 64}
    size = next(iter(axes.values()))
    return RecordIn(
        kernel=kernel,
        axes=axes,
        work=float(work if work is not None else _work(kernel, axes, size)),
        device=device,
        torch_version="2.11.0",
        triton_version="3.6.0",
        source_hash="abc123",
        config=config if config is not None else {"BLOCK_P": 32, "num_warps": 4},
        latency_median_us=latency,
        latency_min_us=latency * 0.95,
        latency_max_us=latency * 1.2,
        latency_iqr_us=latency * 0.05,
        timing_method="cupti",
        rel_error=1e-7,
        n_trials=20,
        n_failed=2,
        tuned_at=T0 + timedelta(minutes=minutes),
        **extra,
    )


def nearest_to(axes: dict[str, Any], kernel: str = KERNEL):
    """find_best's `distance` for a query: the kernel's own "nearest" (KernelDef.distance)."""
    kdef = get_kernel(kernel)
    return lambda other, _work: kdef.distance(axes, other)
