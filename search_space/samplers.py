"""The Optuna sampler of a study (`make_sampler`), and the grid sampler over a space's configs."""
from __future__ import annotations

import json
import random
import warnings
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from .space import SearchSpace
from .tune_options import SAMPLERS, TuneError

# The one parameter of an older grid study (an index into the space's grid); read, never written.
GRID_PARAM = "grid_id"
# Trial system attribute holding the grid point a `_ConfigGridSampler` assigned to a trial.
GRID_ATTR = "ks_grid_point"


class _ConfigGridSampler(optuna.samplers.BaseSampler):
    """Every config of the space's grid once, each trial's parameters the config's own fields.

    Optuna's GridSampler wants a Cartesian product, while a space's grid is filtered by its
    constraints and conditional parameters; a single `grid_id` index parameter made the
    dashboard unreadable. Here each trial is given a grid point (a config) before it runs and
    answers every `suggest_categorical` from it. Points count as visited from a finished trial's
    parameters (enqueued ones included) and a running trial's assigned point; an older study's
    `grid_id` parameter is read as the index into the same grid. Stopping is the loop's."""

    def __init__(self, points: Sequence[Mapping[str, Any]], seed: int | None = None):
        self._points = [dict(p) for p in points]
        self._index = {self._key(p): i for i, p in enumerate(self._points)}
        self._order = list(range(len(self._points)))
        random.Random(seed or 0).shuffle(self._order)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)

    @staticmethod
    def _key(params: Mapping[str, Any]) -> str:
        return json.dumps(sorted(params.items()), default=str)

    def _visited(self, study: optuna.Study) -> tuple[set[int], set[int]]:
        done, running = set(), set()
        for t in study._storage.get_all_trials(study._study_id, deepcopy=False):
            if t.state == TrialState.RUNNING:
                if GRID_ATTR in t.system_attrs:
                    running.add(int(t.system_attrs[GRID_ATTR]))
                continue
            if not t.state.is_finished():
                continue
            if GRID_PARAM in t.params:
                done.add(int(t.params[GRID_PARAM]))
            elif self._key(t.params) in self._index:
                done.add(self._index[self._key(t.params)])
        return done, running

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if GRID_ATTR in trial.system_attrs or "fixed_params" in trial.system_attrs:
            return
        done, running = self._visited(study)
        free = [i for i in self._order if i not in done and i not in running]
        free = free or [i for i in self._order if i not in done] or self._order
        if free:
            study._storage.set_trial_system_attr(trial._trial_id, GRID_ATTR, free[0])

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                           param_name: str, param_distribution: Any) -> Any:
        point = trial.system_attrs.get(GRID_ATTR)
        fixed = trial.system_attrs.get("fixed_params") or {}
        if point is None and GRID_PARAM in fixed:  # re-queued by an older version of the loop
            point = fixed[GRID_PARAM]
        if point is not None and 0 <= int(point) < len(self._points) and param_name in self._points[int(point)]:
            return self._points[int(point)][param_name]
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def make_sampler(name: str, space: SearchSpace, *, seed: int | None = None,
                 n_startup_trials: int = 10) -> optuna.samplers.BaseSampler:
    """The sampler for a study; passed on every load, since load_study would use a default."""
    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials,
                                          multivariate=True, group=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return _ConfigGridSampler([{p.optuna_name: c[p.name] for p in space.params if p.name in c}
                                   for c in space.grid()], seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials,
                                         warn_independent_sampling=False)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=n_startup_trials,
                                            warn_independent_sampling=False)
    raise TuneError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {name!r}")


__all__ = ["make_sampler", "GRID_ATTR", "GRID_PARAM"]
