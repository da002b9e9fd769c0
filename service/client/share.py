"""Sharing what a user's process tuned: checked (an undeclared kernel's winner writes what its
first config writes; a declared kernel's passes the correctness gate) and uploaded in the
background, as a record built here."""
from __future__ import annotations

import builtins
import logging
import math
import os
from typing import Any, Callable, Mapping

from triton.runtime.autotuner import Autotuner as TritonAutotuner
from triton.runtime.autotuner import Config

from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.resolve import Key
from kernelsearch.kernels.undeclared import UndeclaredKernel, written_mismatches

from . import guard
from .backends import BACKENDS
from .identity import knowing_ran
from .launch import launch_alone
from .timing import quantiles

log = logging.getLogger(__name__)


def share_tuned(tuner: TritonAutotuner, und: UndeclaredKernel, case: Key, config: Config,
                timings: Mapping[Config, Any], args: tuple, kwargs: dict, first: Config,
                capture: Mapping[str, Any] | None = None) -> None:
    """Share what this process tuned for an undeclared kernel, once the winner writes what the
    `first` config (after pruning) writes on this call's inputs (every tensor either changes,
    at its dtype's tolerance), and the call's `capture` with it (kept for a search of the key).
    Only a copy of the inputs is taken on the call's path: the check and the upload run in the
    background after the call (the process waits for them at exit)."""
    before = _clone_call(args, kwargs) if canonical_key(config) != canonical_key(first) else None
    stream = _stream_of(args)

    def check_and_upload() -> None:
        err = 0.0
        if before is not None:
            try:
                with stream():
                    ref, got = _clone_call(*before), _clone_call(*before)
                    launch_alone(tuner, first, *ref)
                    launch_alone(tuner, config, *got)
            except Exception as exc:
                log.warning("%s: the config tuned here could not be checked (%s); not shared",
                            und.name, exc)
                return
            names = [*tuner.arg_names[:len(args)], *sorted(kwargs)]
            scratch = {i for i, n in enumerate(names) if n in tuner.reset_to_zero}
            err, bad = written_mismatches(_tensors(before), _tensors(ref), _tensors(got), scratch)
            if bad:
                log.warning("%s: the config tuned here (%s) does not write what the first config "
                            "writes (%s); used here, not shared", und.name, config, "; ".join(bad))
                return
        kdef = knowing_ran(tuner, und, timings)
        if BACKENDS.upload(_undeclared_record(kdef, case, config, timings, err, args),
                           kdef.definition.as_json()) and capture is not None:
            BACKENDS.keep_capture(case, capture)

    BACKENDS.in_background(lambda: guard.guarded(und.name, "sharing the config tuned here",
                                                 check_and_upload, None))


def _stream_of(args: tuple) -> Callable[[], Any]:
    """The caller's current CUDA stream of the call's device, taken on the call's path, as a
    context for the background check: it binds that device's primary context to the background
    thread first (a fresh thread has none; Triton's launch binds one itself, but its host-side
    tensor descriptors (TMA) need it bound already), then follows the call's work on its stream.
    A context that does nothing without a CUDA tensor."""
    import contextlib

    device = next((a.device for a in args if getattr(getattr(a, "device", None), "type", "") == "cuda"),
                  None)
    if device is None:
        return contextlib.nullcontext
    import torch

    caller = torch.cuda.current_stream(device)

    @contextlib.contextmanager
    def on_callers_stream() -> Any:
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)  # a runtime call: binds the primary context here
            with torch.cuda.stream(caller):
                yield

    return on_callers_stream


def _clone_call(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A call's arguments with every tensor cloned (the correctness check writes into these)."""
    def c(v: Any) -> Any:
        return v.clone() if hasattr(v, "clone") and hasattr(v, "dtype") else v

    return tuple(c(a) for a in args), {k: c(v) for k, v in kwargs.items()}


def _tensors(call: tuple[tuple, dict]) -> list[Any]:
    args, kwargs = call
    return [*args, *(kwargs[k] for k in sorted(kwargs))]


def _undeclared_record(und: UndeclaredKernel, case: Key, config: Config,
                       timings: Mapping[Config, Any], rel_error: float, args: tuple) -> Any:
    """The record of a config tuned here: the winner's timing and every config's median."""
    from kernelsearch.kernels.device import device_info, versions
    from kernelsearch.search_space.records import measured_record

    q = {c: quantiles(t) for c, t in timings.items()}
    med, p20, p80 = q[config]
    device = next((a.device for a in args if hasattr(a, "device")), None)
    v = versions()
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    return measured_record(
        und, case.axes_dict, case.device, device_info=device_info(device), torch_version=v["torch"],
        triton_version=v["triton"], config=canonical(config), latency_median_us=med * 1e3,
        latency_min_us=builtins.min(med, p20) * 1e3, latency_max_us=builtins.max(med, p80) * 1e3,
        latency_iqr_us=abs(p80 - p20) * 1e3,
        timing_method="interpreter-wallclock" if interp else "triton-do-bench",
        rel_error=rel_error, n_trials=len(q),
        # A config that failed to build or run here is measured too (None): not measured again.
        config_timings={canonical_key(c): (t[0] * 1e3 if math.isfinite(t[0]) else None)
                        for c, t in q.items()})


def share_declared(kdef: Any, case: Key, config: Config, n_trials: int, args: tuple) -> None:
    """Store the config tuned here for everyone, once it passes the same gate and is timed
    the same way (CUPTI, cold L2) as a worker's; otherwise this process alone uses it."""
    from kernelsearch.kernels.check import check_config
    from kernelsearch.kernels.measure import measure_config

    cfg = canonical(config)
    device = next((a.device for a in args if hasattr(a, "device")), None)
    try:
        checked = check_config(kdef, case.axes_dict, cfg, device=device)
        if not checked.ok:
            log.warning("%s: the config tuned here fails the correctness gate (%s); not stored",
                        kdef.name, checked.detail)
            return
        timing = measure_config(kdef, case.axes_dict, cfg, device=device)
    except Exception as exc:
        log.warning("%s: the config tuned here could not be checked: %s", kdef.name, exc)
        return
    BACKENDS.upload(kdef.record_of(case, cfg, timing, checked, n_trials, device))
