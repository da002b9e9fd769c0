"""A candidate config run as the kernel's own pruner makes it, for each call.

Triton runs a one-config autotuner without calling its pruner, but a pruner may not only pick:
gemlite's `early_config_prune` yields new configs fitted to the call, carrying constexprs the
listed configs never set (NUM_STAGES, EVEN_K, ...). A listed or derived candidate forced alone
would then launch without them (`missing a required argument`). So a search runs each
candidate through the autotuner's `prune_configs` for the call it launches, and runs what the
pruner yields: the same config, a rewritten one, or nothing (the candidate fails on this key).
Candidates the pruner turns into the same configs are one config to time (`ran`).
"""
from __future__ import annotations

from typing import Any, Mapping

from kernelsearch.kernels.configs import canonical, canonical_key


class PrunedAway(Exception):
    """The kernel's pruner yields nothing for this candidate on this call."""


def through_pruner(tuner: Any, candidate: Any, nargs: Mapping[str, Any],
                   kwargs: Mapping[str, Any]) -> list[Any]:
    """What `tuner`'s pruning (early prune, perf model) makes of `candidate` alone (a
    triton.Config) on the call with named arguments `nargs` and launch `kwargs`; [] when it
    drops it. The tuner's configs and nargs are as they were afterwards."""
    saved = (tuner.configs, getattr(tuner, "nargs", None))
    tuner.configs, tuner.nargs = [candidate], dict(nargs)
    try:
        return list(tuner.prune_configs(dict(kwargs)) or [])
    except Exception as exc:  # Triton raises when a pruner returns no config
        if "after pruning" in str(exc):
            return []
        raise
    finally:
        tuner.configs, tuner.nargs = saved


class PrunedRuns:
    """Makes a Triton autotuner run one candidate as its pruner makes it, on every call, until
    `undo()`. `ran` holds the canonical key of each config launched since the last `use`: the
    candidate's identity on this key (two candidates that ran the same configs are one)."""

    def __init__(self, tuner: Any) -> None:
        self.tuner, self.candidate = tuner, None
        self.ran: dict[str, None] = {}
        self.made: dict[str, dict[str, Any]] = {}
        self._pruned: dict[tuple, Any] = {}
        self._run = tuner.run
        tuner.run = self._pruned_run  # an instance attribute: the kernel's launches call it

    def use(self, candidate: Any) -> None:
        """Run `candidate` (a triton.Config) from now on."""
        self.candidate, self.ran, self._pruned = candidate, {}, {}

    def identity(self) -> str:
        """The configs the last `use`'s calls ran, as one key (dedupe of candidates)."""
        return "|".join(self.ran)

    def _pruned_run(self, *args: Any, **kwargs: Any) -> Any:
        if self.candidate is None:
            return self._run(*args, **kwargs)
        nargs = dict(zip(self.tuner.arg_names, args))
        # Pruned once per autotuning key, as Triton prunes (a timing loop's calls pay a lookup).
        named = {**nargs, **kwargs}
        key = tuple(named.get(k) for k in self.tuner.keys) + tuple(
            str(v.dtype) for v in named.values() if hasattr(v, "dtype"))
        if key not in self._pruned:
            made = through_pruner(self.tuner, self.candidate, nargs, kwargs)
            if not made:
                raise PrunedAway(f"the kernel's pruner drops {canonical(self.candidate)} on this call")
            ck = canonical_key(canonical(made[0]))
            self.made.setdefault(ck, canonical(made[0]))
            self._pruned[key] = (made[0], ck)
        config, ck = self._pruned[key]
        self.ran[ck] = None
        self.tuner.configs = [config]
        self.tuner.cache.clear()
        return self._run(*args, **kwargs)

    def undo(self) -> None:
        """The tuner's own run again."""
        self.tuner.__dict__.pop("run", None)
        self.candidate = None


__all__ = ["PrunedAway", "PrunedRuns", "through_pruner"]
