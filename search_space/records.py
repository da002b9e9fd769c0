"""From a study's best trial to the record the store keeps: the PyTorch references timed once for
the record's speedups, the roofline, the RecordIn. Kept apart from the tuner's Optuna loop, which
only finds the best; this is what a record says about it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping

from kernelsearch.kernels import get_kernel
from kernelsearch.kernels.device import peak_flops
from kernelsearch.kernels.undeclared import NotDeclared

from .runner import TrialRunner

if TYPE_CHECKING:
    from kernelsearch.db.views import RecordIn
    from kernelsearch.db.views import Accepted
    from kernelsearch.kernels.spec import KernelDef

REFERENCES = ("auto", "none", "eager", "both")


@dataclass(frozen=True)
class BestTrial:
    """A study's best evaluated config, with what its trials add up to."""

    kernel: str
    axes: dict[str, int]
    device: str
    study_name: str
    latency_us: float
    config: dict[str, Any]
    # The trial's TrialOutcome as stored (timing, rel_errors).
    outcome: dict[str, Any]
    n_trials: int
    n_failed: int


def roofline_pct(kdef: KernelDef, axes: Mapping[str, int], device: str, latency_us: float,
                 bandwidth: float | None) -> float | None:
    """How close the latency comes to the case's floor: its bytes at `bandwidth` (bytes/s), or
    its flops at the device's peak, whichever is slower; None without either."""
    try:
        floor_s = [float(kdef.bytes_moved(axes)) / bandwidth] if bandwidth else []
    except NotDeclared:  # an undeclared kernel knows no bytes
        floor_s = []
    peak = peak_flops(device)
    if kdef.flops is not None and peak:
        floor_s.append(float(kdef.flops(axes)) / peak)
    return 100.0 * max(floor_s) / (latency_us * 1e-6) if floor_s else None


def reference_latencies(runner: TrialRunner, kdef: KernelDef, axes: Mapping[str, int], *,
                        method: str, reference: str, measure_n: int) -> tuple[float | None, float | None]:
    """(eager, torch.compile) latencies of the kernel's PyTorch reference, each None when not
    asked for or timed by another method than the record's (the speedups would compare apples
    with pears). `reference` is one of REFERENCES (TuneOptions checks it); "auto": both on a
    GPU, eager otherwise."""
    if reference == "auto":
        reference = "both" if runner.on_gpu else "eager"
    if kdef.torch_reference is None:
        reference = "none"
    eager_us = compile_us = None
    if reference in ("eager", "both"):
        ref = runner.measure_reference(kdef.name, dict(axes), n=measure_n)
        if ref.get("method") == method:
            eager_us = float(ref["median_us"])
    if reference == "both":
        ref = runner.measure_reference(kdef.name, dict(axes), compiled=True, n=measure_n)
        if ref.get("method") == method:
            compile_us = float(ref["median_us"])
    return eager_us, compile_us


def measured_record(kdef: KernelDef, axes: Mapping[str, Any], device: str, *,
                    config: Mapping[str, Any], **measured: Any) -> RecordIn:
    """The one builder of a record from a measurement (a worker's, the decorator's, a tool's):
    the kernel's name, source hash and `work` (`KernelDef.work`: the one size "nearest" ranks
    cases by) come from its declaration; `measured` is the rest of `RecordIn`'s fields. Not yet
    accepted: it goes through the gate (acceptance.accepted) before any store takes it."""
    from kernelsearch.db.views import RecordIn

    fields = {"source_hash": kdef.source_hash, **measured}
    return RecordIn(kernel=kdef.name, axes=dict(axes), work=float(kdef.work(axes)), device=device,
                    config=dict(config), **fields)


def best_record(best: BestTrial, runner: TrialRunner, *, job_id: int | None, reference: str,
                copy_bandwidth: float | None, measure_n: int,
                config_timings: Mapping[str, float | None] | None = None) -> Accepted[RecordIn]:
    """The record of `best`; on a CUPTI-timed result, the roofline (the copy bandwidth measured
    on the runner's device unless given). `config_timings`: every config measured, by
    config_key (None: failed), which a decorator serving the record holds to its config list.
    It passes the acceptance gate like any record (acceptance.RecordRejected names the field
    otherwise)."""
    from .acceptance import accepted

    kdef = get_kernel(best.kernel)
    timing = best.outcome.get("timing") or {}
    errs = [v for v in (best.outcome.get("rel_errors") or {}).values()
            if v is not None and math.isfinite(v)]
    method = timing.get("method", "")
    roofline = None
    if method == "cupti":
        bw = copy_bandwidth if copy_bandwidth is not None else runner.copy_bandwidth()
        roofline = roofline_pct(kdef, best.axes, best.device, best.latency_us, bw)
    eager_us, compile_us = reference_latencies(runner, kdef, best.axes, method=method,
                                               reference=reference, measure_n=measure_n)
    versions: dict[str, Any] = runner.versions or {}
    value = best.latency_us
    return accepted(measured_record(
        kdef, best.axes, best.device, device_info=runner.device_info,
        torch_version=versions.get("torch", ""), triton_version=versions.get("triton", ""),
        config=best.config, latency_median_us=value,
        latency_min_us=float(timing.get("min_us", value)),
        latency_max_us=float(timing.get("max_us", value)),
        latency_iqr_us=float(timing.get("iqr_us", 0.0)), timing_method=method,
        rel_error=max(errs) if errs else 0.0, n_trials=best.n_trials, n_failed=best.n_failed,
        roofline_pct=roofline, eager_latency_us=eager_us, compile_latency_us=compile_us,
        study_name=best.study_name, job_id=job_id, tuned_at=datetime.now(timezone.utc),
        config_timings=dict(config_timings) if config_timings is not None else None))


__all__ = ["BestTrial", "REFERENCES", "best_record", "measured_record", "reference_latencies", "roofline_pct"]
