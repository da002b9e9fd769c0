"""Records as a worker would store them, for the autotune tests."""
from __future__ import annotations

from trusted_records import trusted

from typing import Any, Mapping

from kernelsearch.db.views import RecordIn
from kernelsearch.kernels.device import INTERPRETER_DEVICE, versions


def put_record(store: Any, kernel: Any, axes: Mapping[str, int], config: Mapping[str, Any],
               device: str = INTERPRETER_DEVICE, latency_us: float = 10.0, **extra: Any) -> None:
    v = versions()
    store.ensure_device({"name": device})
    store.upsert_best(trusted(RecordIn(
        kernel=kernel.name, axes=dict(axes), work=float(kernel.bytes_moved(axes)), device=device,
        torch_version=v["torch"], triton_version=v["triton"], source_hash=kernel.source_hash,
        config=dict(config), latency_median_us=latency_us, latency_min_us=latency_us,
        latency_max_us=latency_us, latency_iqr_us=0.0, timing_method="interpreter-wallclock",
        rel_error=0.0, n_trials=1, device_info={"name": device}, **extra)))
