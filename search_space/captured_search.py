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

from kernelsearch.kernels.capture import Capture, CapturedKernel, captured_kernel
from kernelsearch.kernels.configs import canonical, canonical_key, to_triton_config
from kernelsearch.kernels.device import default_device, device_info, device_name, versions
from kernelsearch.kernels.undeclared import Definition

from .key_search import Budget, ConfigFailed, choices_of, refuse, search_key
from .remeasure import DEFAULT_REPEATS, remeasure
from .strict_gate import GateMode, capture_draws, written_check
from .through_pruner import through_pruner

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


def _runs_as(kdef: CapturedKernel, space: Mapping[str, Mapping[str, Any]],
             inputs: list[torch.Tensor]) -> dict[str, dict[str, Any] | None]:
    """What the kernel's own pruner makes of each candidate alone on the captured call (None:
    it drops it), set as the kernel's `runs_as`: a candidate runs as the user's call would."""
    tuner = kdef.tuner
    if getattr(tuner, "early_config_prune", None) is None and \
            getattr(tuner, "perf_model", None) is None:
        return {k: dict(c) for k, c in space.items()}
    nargs = kdef.call_args(inputs)
    made: dict[str, dict[str, Any] | None] = {}
    for k, c in space.items():
        got = through_pruner(tuner, to_triton_config(c, tuner.configs), nargs, {})
        made[k] = canonical(got[0]) if got else None
    kdef.runs_as.update({k: m for k, m in made.items() if m is not None})
    return made


def _edge_run(defn: Definition, edge: Capture, kdef: CapturedKernel,
              space: Mapping[str, Mapping[str, Any]],
              device: torch.device) -> Callable[[Mapping[str, Any], list[Any]], None]:
    """How a config runs on an edge call of the key: the edge's own kernel (its scalars and
    grids), each config as the kernel's pruner makes it on that call."""
    ekdef = captured_kernel(defn, edge, tuner=kdef.tuner)
    _runs_as(ekdef, space, list(ekdef.captured_inputs({}, device=device)))

    def run(cfg: Mapping[str, Any], values: list[Any]) -> None:
        ekdef.captured_launch(*values, config=cfg)
    return run


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
    made = _runs_as(kdef, space, inputs)
    listed = [canonical(c) for c in kdef.listed_configs]  # as the kernel's pruner made it
    method = ""
    timed: dict[str, float] = {}  # by the config the pruner made: candidates it merges are one

    def evaluate(cfg: dict[str, Any]) -> float:
        nonlocal method
        key = canonical_key(cfg)
        if key not in space:
            raise ConfigFailed("outside the captured space (no grid)")
        if made[key] is None:
            raise ConfigFailed("the kernel's pruner drops it on this call")
        as_made = canonical_key(made[key])
        if as_made in timed:
            return timed[as_made]
        try:
            kdef.captured_launch(*inputs, config=cfg)  # compile and load first
            timer, method = _timer(lambda: kdef.captured_launch(*inputs, config=cfg), device)
            timed[as_made] = statistics.median(timer() for _ in range(3))
            return timed[as_made]
        except Exception as exc:  # noqa: BLE001 - compile, resources, launch: a failed trial
            raise ConfigFailed(f"{type(exc).__name__}: {exc}"[:500]) from None

    def ran_as(key: str) -> str:
        """A candidate's key as the pruner ran it (itself when the pruner drops it)."""
        m = made.get(key)
        return canonical_key(m) if m is not None else key

    if listed_timings:  # a record's timings are keyed by what ran
        listed_timings = {canonical_key(c): listed_timings[ran_as(canonical_key(c))]
                          for c in listed if ran_as(canonical_key(c)) in listed_timings}
    found = search_key(evaluate, listed, storage=storage, study_name=study_name,
                       listed_timings=listed_timings,
                       budget=Budget(int(budget.get("n_trials", 64)), budget.get("timeout_s")),
                       sampler=sampler, allowed=space, choices=choices_of(list(space.values())))
    timings: dict[str, float | None] = {}
    for k, t in found.timings.items():
        was = timings.get(ran_as(k))
        timings[ran_as(k)] = t if was is None else (was if t is None else min(was, t))
    configs = {ran_as(k): dict(made[k] or found.configs[k])
               for k in found.timings if k in found.configs}
    out: dict[str, Any] = {
        "timings": timings, "listed": list(dict.fromkeys(ran_as(k) for k in found.listed)),
        "evaluated": found.evaluated,
        "trials_to_best": found.trials_to_best, "stopped": found.stopped, "configs": configs,
        "pruned": [c for k, c in configs.items() if k not in space],
        "winner_origin": "list", "winner": None, "verdict": None, "refused": {},
        "gate_rel_error": 0.0, "device": device_name(device), "device_info": device_info(device),
        "versions": versions(), "timing_method": method or "interpreter-wallclock"}
    lb = found.listed_best
    if lb is None:
        return out
    out["winner"] = ran_as(lb[0])
    first = kdef.first_config
    edge_caps = [Capture.from_json(e) for e in edges or ()]
    draws = capture_draws(cap, device, mode=GateMode.STRICT, edges=edge_caps,
                          edge_runs=[_edge_run(defn, e, kdef, space, device) for e in edge_caps])

    def run(cfg: Mapping[str, Any], values: list[Any]) -> None:
        kdef.captured_launch(*values, config=cfg)

    for key in found.searched_candidates(CANDIDATES):
        if ran_as(key) in out["listed"]:
            continue  # the pruner runs it as a listed config: the list's own
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
            out.update(winner_origin="search", winner=ran_as(key), gain=v.speedup,
                       gain_low=v.low, gate_edges=len(edge_caps),
                       gate_rel_error=gate.worst_rel_error)
        break  # one re-measure: the fastest candidate that is right
    return out


__all__ = ["search_captured", "CANDIDATES"]
