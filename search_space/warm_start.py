"""Warm start: the configs a study tries first (the kernel's default, the space's seeds, the
nearest cases' bests), their enqueueing into a study, and their compiling ahead (`prefetch_case`)."""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from kernelsearch.db.interfaces import RecordRepository
from kernelsearch.kernels import get_kernel
from kernelsearch.kernels.errors import InvalidConfig

from .space import SearchSpace, case_space, get_space

log = logging.getLogger(__name__)

WARM_NEIGHBOURS = 3


def warm_start_configs(store: RecordRepository, kernel: str, axes: Mapping[str, int], device: str,
                       space: SearchSpace, k: int = WARM_NEIGHBOURS) -> list[tuple[dict[str, Any], dict[str, int]]]:
    """Best configs of the k nearest other cases of this kernel and device that fit the space."""
    kdef = get_kernel(kernel)
    recs = [r for r in store.list_records(kernel, device)
            if dict(r.axes) != dict(axes) and math.isfinite(kdef.distance(axes, r.axes))]
    recs.sort(key=lambda r: (kdef.distance(axes, r.axes), r.latency_median_us))
    out: list[tuple[dict[str, Any], dict[str, int]]] = []
    keys: set[str] = set()
    for r in recs:
        if len(out) >= k:
            break
        try:
            # In the space's own form: a record holds the kernel's canonical config, with
            # parameters the space leaves inactive (B's num_stages on the tiles grid), which
            # violation() would reject as "only applies when ...".
            cfg = space.config_of(space.to_params(r.config))
            if space.violation(cfg) is not None:
                continue
            key = space.key(cfg)
        except InvalidConfig:
            continue
        if key not in keys:
            keys.add(key)
            out.append((space.canonical(cfg), dict(r.axes)))
    return out


def default_in_space(space: SearchSpace) -> dict[str, Any] | None:
    """The kernel's default config in the space's own form, or None when the space excludes it."""
    try:
        # In the space's own form: parameters the space leaves inactive are dropped.
        default = space.config_of(space.to_params(space.kernel.default_config))
    except InvalidConfig:
        return None  # a default outside this space (a test space, say)
    return default if space.violation(default) is None else None


def warm_start_picks(store: RecordRepository, kernel: str, axes: Mapping[str, int], device: str,
                     space: SearchSpace) -> list[tuple[dict[str, Any], Any]]:
    """(config, source) in the order a study tries them. The kernel's default goes first: a short
    study must never record a config slower than what an untuned call already gets (a short
    study seeded from neighbours only can end well above it: docs/perf-notes.md). Then the space file's seeds, configs that won some suite case in a sweep (the way
    triton.autotune is given a short list), then the nearest cases' bests."""
    picks: list[tuple[dict[str, Any], Any]] = []
    default = default_in_space(space)
    if default is not None:
        picks.append((default, "default"))
    picks += [(cfg, f"seed: {note}") for cfg, note in space.seeds]
    try:
        picks += warm_start_configs(store, kernel, axes, device, space)
    except Exception as exc:  # a store that cannot answer leaves the study cold, not broken
        log.warning("warm start from neighbours skipped for %s %s: %s", kernel, axes, exc)
    return picks


def enqueue_warm_start(study: optuna.Study, store: RecordRepository, kernel: str,
                       axes: Mapping[str, int], device: str, space: SearchSpace,
                       seen: Mapping[str, Any]) -> int:
    """Enqueue the study's warm-start picks it has neither evaluated (`seen`, by config key) nor
    queued; returns how many were enqueued."""
    picks = warm_start_picks(store, kernel, axes, device, space)
    waiting = [t.system_attrs.get("fixed_params") for t in
               study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    n = 0
    for cfg, src in picks:
        key = space.key(cfg)
        params = space.to_params(cfg)
        if key in seen or params in waiting:
            continue
        study.enqueue_trial(params, user_attrs={"ks_warm_start_from": src}, skip_if_exists=True)
        waiting.append(params)
        n += 1
    return n


def prefetch_case(runner: Any, store: RecordRepository, kernel: str, axes: Mapping[str, int], device: str, *,
                  space: SearchSpace | None = None,
                  also: Sequence[Mapping[str, Any]] = ()) -> int:
    """Queue a case's warm-start configs (`warm_start_picks` and `also`)
    on the runner's compile-ahead pool before the case starts; returns how many were queued.
    Only a hint: a config missing from the pool is compiled by the trial itself."""
    if not runner.compile_workers:
        return 0
    space = space or case_space(kernel, axes, get_space)
    axes = get_kernel(kernel).validate_axes(axes)
    configs = [dict(c) for c in also]
    configs += [c for c, _ in warm_start_picks(store, kernel, axes, device, space)]
    # Each is valid already (a run trial, or checked against the space): canonical, once each.
    fresh = {space.key(c): space.canonical(c) for c in configs}
    return runner.prefetch(kernel, axes, list(fresh.values()))
