"""One key of an undeclared kernel searched from its capture, start to end, in a job child:
the per-key study (search_space.key_search) over the configs the capture has grids for (the
list and the decorator's `search_space`, e.g. the derived space), the strict gate on each
searched candidate (search_space.strict_gate), the interleaved re-measure of the one that passes
against the list's best (search_space.remeasure). It returns plain data; the worker turns it
into a record (service.search_jobs).

It runs the user's kernel, so it runs in a disposable process (service.job_child), never in the
worker: a config that crashes the CUDA context ends the child, not the worker, and the study,
in the store, keeps every trial told before.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping

import torch

from kernelsearch.kernels.capture import Capture, captured_kernel
from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.device import default_device, device_info, device_name, versions
from kernelsearch.kernels.undeclared import Definition

from .key_search import Budget, ConfigFailed, choices_of, refuse, search_key
from .remeasure import DEFAULT_REPEATS, remeasure
from .strict_gate import GateMode, capture_draws, written_check

CANDIDATES = 3  # searched configs the gate and the re-measure are asked about, fastest first


def _timer(run: Callable[[], Any], device: torch.device) -> tuple[Callable[[], float], str]:
    """A per-call time (us) of `run` and the method's name: Triton's do_bench (median of a short
    burst) on a GPU, the wall clock of one call under the interpreter."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return (lambda: float(do_bench(run, warmup=2, rep=10, return_mode="median")) * 1e3,
                "triton-do-bench")

    def wall() -> float:
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e6
    return wall, "interpreter-wallclock"


def search_captured(definition: Mapping[str, Any], capture: Mapping[str, Any], *, storage: str,
                    study_name: str, budget: Mapping[str, Any], sampler: str,
                    listed_timings: Mapping[str, float | None] | None = None,
                    edges: list[Mapping[str, Any]] | None = None,
                    repeats: int = DEFAULT_REPEATS, tuner: Any = None) -> dict[str, Any]:
    """Search one captured key (module docstring); `tuner` is the user's autotuner when the
    caller has it (a test), else the definition's module is imported."""
    defn = Definition.from_json(definition)
    cap = Capture.from_json(capture)
    kdef = captured_kernel(defn, cap, tuner=tuner)
    device = default_device()
    axes = cap.case_axes(defn) or {}
    inputs = list(kdef.captured_inputs(axes, device=device))
    space = {canonical_key(c): canonical(c) for c in (*defn.configs, *defn.search_space)}
    listed = [canonical(c) for c in defn.configs]
    method = ""

    def evaluate(cfg: dict[str, Any]) -> float:
        nonlocal method
        if canonical_key(cfg) not in space:
            raise ConfigFailed("outside the captured space (no grid)")
        try:
            kdef.captured_launch(*inputs, config=cfg)  # compile and load first
            timer, method = _timer(lambda: kdef.captured_launch(*inputs, config=cfg), device)
            return statistics.median(timer() for _ in range(3))
        except Exception as exc:  # noqa: BLE001 - compile, resources, launch: a failed trial
            raise ConfigFailed(f"{type(exc).__name__}: {exc}"[:500]) from None

    found = search_key(evaluate, listed, storage=storage, study_name=study_name,
                       listed_timings=listed_timings,
                       budget=Budget(int(budget.get("n_trials", 64)), budget.get("timeout_s")),
                       sampler=sampler, allowed=space, choices=choices_of(list(space.values())))
    out: dict[str, Any] = {
        "timings": found.timings, "listed": list(found.listed), "evaluated": found.evaluated,
        "trials_to_best": found.trials_to_best, "stopped": found.stopped,
        "configs": {k: found.configs[k] for k in found.timings if k in found.configs},
        "winner_origin": "list", "winner": None, "verdict": None, "refused": {},
        "gate_rel_error": 0.0, "device": device_name(device), "device_info": device_info(device),
        "versions": versions(), "timing_method": method or "interpreter-wallclock"}
    lb = found.listed_best
    if lb is None:
        return out
    out["winner"] = lb[0]
    first = kdef.first_config
    draws = capture_draws(cap, device, mode=GateMode.STRICT,
                          edges=[Capture.from_json(e) for e in edges or ()])

    def run(cfg: Mapping[str, Any], values: list[Any]) -> None:
        kdef.captured_launch(*values, config=cfg)

    for key in found.searched_candidates(CANDIDATES):
        cfg = found.configs[key]
        gate = written_check(run, first, cfg, draws, mode=GateMode.STRICT)
        if not gate.passed:
            why = "; ".join(gate.reasons)[:500]
            refuse(storage, study_name, key, why)
            out["refused"][key] = why
            continue
        list_cfg = found.configs[lb[0]]
        t_list, _ = _timer(lambda: kdef.captured_launch(*inputs, config=list_cfg), device)
        t_new, _ = _timer(lambda: kdef.captured_launch(*inputs, config=cfg), device)
        v = remeasure(t_list, t_new, repeats=repeats)
        out["verdict"] = {"serve_searched": v.serve_searched, "speedup": v.speedup, "low": v.low,
                          "high": v.high, "list_median_us": v.list_median_us,
                          "searched_median_us": v.searched_median_us, "config": key}
        if v.serve_searched:
            out.update(winner_origin="search", winner=key, gain=v.speedup,
                       gate_rel_error=gate.worst_rel_error)
        break  # one re-measure: the fastest candidate that is right
    return out


__all__ = ["search_captured", "CANDIDATES"]
