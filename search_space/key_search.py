"""One key's search beyond its config list: an Optuna study per key, in the store, on a worker.

The study's parameters are the derived space's (search_space.derived), one categorical each.
It is warm-started with the listed configs: those the key already measured are added as finished
trials with their timings (`add_trial`: the sampler learns from them at no cost), the others
are enqueued to run first. A config that fails to compile, runs out of resources or fails at
launch is a FAIL trial, never an error; a config the strict gate refused (search_space.
strict_gate) is remembered on the study and never run again. The study lives in the Optuna
storage it is given (db.optuna_storage: the store's database), so a worker that dies loses
only the trial it was running: the next run of the same key loads the study and goes on to
the budget, which counts the configs evaluated by every run.

Default sampler: TPE (`DEFAULT_SAMPLER`). On the comparison of docs/benchmarks/
issue35_samplers.py (same synthetic keys, trials to reach within 2 % of an exhaustive sweep's
best) TPE reached it in the fewest trials on the median key, and unlike GP it needs no scipy
and costs milliseconds per ask over a few thousand categorical points.
"""
from __future__ import annotations

import logging
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from kernelsearch.kernels.configs import canonical, canonical_key

from .derived import derived_choices
from .tuner import fail_running_trials

log = logging.getLogger(__name__)

DEFAULT_SAMPLER = "tpe"
SAMPLERS = ("tpe", "random", "gp", "cmaes", "qmc")
# Optuna's categorical choices cannot hold "absent"; a parameter a config does not set is this.
ABSENT = "__absent__"
A_CONFIG = "ks_config"            # a trial's canonical config key
A_LISTED = "ks_listed"            # a warm-start trial of a listed config
A_RAN = "ks_ran"                  # a trial whose config this search evaluated
A_FAILED = "ks_failed"            # why a trial failed (compile, resources, launch, gate)
A_REFUSED = "ks_refused"          # study attr: {config key: why} the strict gate refused
# Asks without a new config (the sampler proposing known ones) allowed per budgeted trial.
MAX_REPEATS_PER_TRIAL = 20


class ConfigFailed(Exception):
    """A config that cannot run on this key: did not compile, out of resources, failed to launch.
    The search records it as a failed trial and goes on."""


@dataclass(frozen=True)
class Budget:
    """A key's search budget: configs evaluated beyond the list (all runs of the study together;
    the listed configs a key has not measured yet run first, outside it) and seconds (this run,
    the listed ones included)."""

    n_trials: int = 64
    timeout_s: float | None = 300.0

    def __post_init__(self) -> None:
        if self.n_trials < 0:
            raise ValueError(f"n_trials: expected >= 0, got {self.n_trials}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s: expected > 0 or None, got {self.timeout_s}")


@dataclass
class KeySearch:
    """What a key's search found: every config's time (None: failed), the list's best and the
    best overall, and how many configs it evaluated to find it."""

    timings: dict[str, float | None] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    listed: tuple[str, ...] = ()
    evaluated: int = 0           # configs beyond the list run by the search
    trials_to_best: int | None = None
    stopped: str = ""
    order: list[str] = field(default_factory=list)  # configs in the order they ran

    def ranked(self) -> list[tuple[str, float]]:
        """Measured configs, fastest first."""
        return sorted(((k, t) for k, t in self.timings.items() if t is not None), key=lambda kt: kt[1])

    @property
    def listed_best(self) -> tuple[str, float] | None:
        got = [(k, self.timings[k]) for k in self.listed if self.timings.get(k) is not None]
        return min(got, key=lambda kt: kt[1]) if got else None  # type: ignore[return-value,arg-type]

    @property
    def best(self) -> tuple[str, float] | None:
        r = self.ranked()
        return r[0] if r else None

    def searched_candidates(self, k: int = 3) -> list[str]:
        """Up to k configs outside the list faster than the list's best, fastest first: what the
        strict gate and the re-measure are asked about."""
        lb = self.listed_best
        return [key for key, t in self.ranked() if key not in self.listed
                and (lb is None or t < lb[1])][:k]


def choices_of(configs: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """Each parameter's values over a space given as configs (sorted where they sort)."""
    out: dict[str, list[Any]] = {}
    for c in configs:
        for k, v in canonical(c).items():
            if v not in out.setdefault(k, []):
                out[k].append(v)
    done: dict[str, tuple[Any, ...]] = {}
    for k, vals in out.items():
        try:
            done[k] = tuple(sorted(vals))
        except TypeError:
            done[k] = tuple(vals)
    return done


def make_sampler(name: str, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """A sampler over the derived space's categorical parameters; passed on every load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True,
                                              group=True)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8,
                                             warn_independent_sampling=False)
        if name == "cmaes":
            return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=8,
                                                warn_independent_sampling=False)
        if name == "qmc":
            return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {name!r}")


def _params(cfg: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {n: cfg.get(n, ABSENT) for n in names}


def _config(params: Mapping[str, Any]) -> dict[str, Any]:
    return canonical({k: v for k, v in params.items() if v != ABSENT})


def _distributions(choices: Mapping[str, Sequence[Any]], listed: Sequence[Mapping[str, Any]]
                   ) -> dict[str, BaseDistribution]:
    out: dict[str, BaseDistribution] = {}
    for n, ch in choices.items():
        vals = list(ch) + ([ABSENT] if any(n not in c for c in listed) else [])
        out[n] = CategoricalDistribution(vals)
    return out


def search_key(evaluate: Callable[[dict[str, Any]], float], listed: Sequence[Any], *,
               storage: Any, study_name: str,
               choices: Mapping[str, Sequence[Any]] | None = None,
               listed_timings: Mapping[str, float | None] | None = None,
               budget: Budget = Budget(), sampler: str = DEFAULT_SAMPLER,
               allowed: Mapping[str, Mapping[str, Any]] | None = None,
               seed: int | None = 0, clock: Callable[[], float] = time.monotonic) -> KeySearch:
    """Search one key: `evaluate(config)` times a config (us, lower is better) or raises
    ConfigFailed; `listed` is the kernel's config list, `choices` the space (default: derived
    from the list), `listed_timings` what the key measured of the list already (by
    canonical_key), `storage` an Optuna storage or URL, `study_name` the key's study, `allowed`
    the configs that can run at all, by key (a capture's: those it has grids for; default every
    config of `choices`): a proposal outside them is a failed trial that costs no budget, and
    a config of them not run yet is queued next, so a sparse space is still covered."""
    allowed_configs = allowed
    listed_c = [canonical(c) for c in listed]
    if not listed_c:
        raise ValueError("listed: a key's search needs the kernel's config list")
    choices = dict(choices) if choices is not None else derived_choices(listed_c)
    names = list(choices)
    dists = _distributions(choices, listed_c)
    study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize",
                                sampler=make_sampler(sampler, seed), load_if_exists=True)
    fail_running_trials(study)  # a dead worker's trial, never told
    found = KeySearch(listed=tuple(canonical_key(c) for c in listed_c))
    for c in listed_c:
        found.configs[canonical_key(c)] = c
    refused = set(study.user_attrs.get(A_REFUSED, {}))
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        key = t.user_attrs.get(A_CONFIG)
        ran = bool(t.user_attrs.get(A_RAN))
        if key is None or not (ran or t.user_attrs.get(A_LISTED)):
            continue  # a repeat or a proposal outside the space: nothing was run
        found.timings[key] = t.value if t.state == TrialState.COMPLETE else None
        found.configs.setdefault(key, _config(t.params))
        if ran:
            found.order.append(key)
        if ran and key not in found.listed:
            found.evaluated += 1
    for key in refused:
        found.timings[key] = None
    _warm_start(study, listed_c, names, dists, listed_timings or {}, found)
    start = clock()
    repeats = 0
    rng = random.Random(seed)
    space_of = {k: v for k, v in (allowed_configs or {}).items()}

    def allowed_left() -> list[Mapping[str, Any]]:
        return [c for k, c in space_of.items() if k not in found.timings and k not in refused]

    best_so_far = found.best[1] if found.best else math.inf
    while found.evaluated < budget.n_trials:
        if budget.timeout_s is not None and clock() - start >= budget.timeout_s:
            found.stopped = "timeout"
            break
        trial = study.ask(dists)
        cfg = _config(trial.params)
        key = canonical_key(cfg)
        trial.set_user_attr(A_CONFIG, key)
        if allowed is not None and key not in allowed and key not in found.timings:
            trial.set_user_attr(A_FAILED, "outside the space")
            study.tell(trial, state=TrialState.FAIL)
            _enqueue_unexplored(study, rng, allowed_left(), names)
            repeats += 1
            if repeats > MAX_REPEATS_PER_TRIAL * max(1, budget.n_trials):
                found.stopped = "space exhausted"
                break
            continue
        if key in found.timings or key in refused:
            # Known: told again at no cost (a refused or failed config is never run again).
            known = found.timings.get(key)
            if key in refused or known is None:
                trial.set_user_attr(A_FAILED, "known failure")
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, known)
            if allowed is not None:
                _enqueue_unexplored(study, rng, allowed_left(), names)
            repeats += 1
            if repeats > MAX_REPEATS_PER_TRIAL * max(1, budget.n_trials):
                found.stopped = "space exhausted"
                break
            continue
        found.configs[key] = cfg
        found.order.append(key)
        if key not in found.listed:
            found.evaluated += 1
        trial.set_user_attr(A_RAN, True)
        try:
            value = float(evaluate(cfg))
            if not math.isfinite(value) or value <= 0:
                raise ConfigFailed(f"no timing ({value!r})")
        except ConfigFailed as exc:
            found.timings[key] = None
            trial.set_user_attr(A_FAILED, str(exc)[:500])
            study.tell(trial, state=TrialState.FAIL)
            continue
        found.timings[key] = value
        study.tell(trial, value)
        if value < best_so_far:
            best_so_far, found.trials_to_best = value, found.evaluated
    else:
        found.stopped = found.stopped or "budget"
    return found


def _warm_start(study: optuna.Study, listed: Sequence[dict[str, Any]], names: Sequence[str],
                dists: Mapping[str, BaseDistribution],
                timings: Mapping[str, float | None], found: KeySearch) -> None:
    """Listed configs into the study once: measured ones as finished trials with their timings,
    the others enqueued (run first, counted in the budget)."""
    waiting = [t.system_attrs.get("fixed_params") for t in
               study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    for cfg in listed:
        key = canonical_key(cfg)
        if key in found.timings:
            continue
        params = _params(cfg, names)
        if key in timings:
            t = timings[key]
            ok = t is not None and math.isfinite(t) and t > 0
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions=dict(dists),
                value=float(t) if ok else None,  # type: ignore[arg-type]
                state=TrialState.COMPLETE if ok else TrialState.FAIL,
                user_attrs={A_CONFIG: key, A_LISTED: True}))
            found.timings[key] = float(t) if ok else None  # type: ignore[arg-type]
        elif params not in waiting:
            study.enqueue_trial(params, user_attrs={A_LISTED: False})
            waiting.append(params)


def _enqueue_unexplored(study: optuna.Study, rng: random.Random, left: Sequence[Mapping[str, Any]],
                        names: Sequence[str]) -> None:
    """Queue one config not run yet (the sampler proposed a known one, or one outside the space)."""
    if left and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study.enqueue_trial(_params(rng.choice(list(left)), names))


def refuse(storage: Any, study_name: str, config_key: str, why: str) -> None:
    """Record on the key's study that the strict gate refused a config, and why: never run or
    served again (a finished trial cannot be changed; the study's attribute is the record)."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    got = dict(study.user_attrs.get(A_REFUSED, {}))
    got[config_key] = why[:500]
    study.set_user_attr(A_REFUSED, got)


def refused_keys(storage: Any, study_name: str) -> set[str]:
    """The configs the strict gate refused for this key's study."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    return set(study.user_attrs.get(A_REFUSED, {}))


__all__ = ["choices_of", "Budget", "ConfigFailed", "KeySearch", "search_key", "make_sampler", "refuse",
           "refused_keys", "DEFAULT_SAMPLER", "SAMPLERS"]
