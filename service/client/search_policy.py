"""The user's side of search beyond the list: which configs go to the workers, and
whether a searched winner is served.

- `search_space="derived"` (or a `DerivedRule`) on `@kernelsearch.autotune` sends the derived
  space (search_space.derived says what it holds) beyond the list to the workers with the
  call's capture, at most `KS_SEARCH_MAX_CONFIGS` of them (a seeded sample, the same in every
  process). A list of `triton.Config` is sent as given; nothing (the default) searches the list
  only.
- `KS_AUTOTUNE_SERVE_SEARCHED`: a record whose winner lies beyond the list is served where this
  allows it; otherwise the call runs the list's best by the record's own timings. `auto`: a
  declared kernel's always (its declaration's gate checked it); an undeclared kernel's when the
  record carries the evidence that stands for a declaration (`searched_evidence`): the strict
  gate ran it on fresh draws of the call and on every edge call the key had, and the lower
  bound of its re-measured gain over the list's best is above 1 (a gain of exactly 1 is no
  improvement). A record without that evidence (stored before it was kept, or uploaded) is not
  served under `auto`.
"""
from __future__ import annotations

import logging
import math
import random
from typing import Any, Mapping, Sequence

from kernelsearch.db.statuses import WinnerOrigin
from kernelsearch.kernels.configs import canonical_key, to_triton_config
from kernelsearch.search_space.derived import DerivedRule, SpaceMode, beyond_list, derived_configs

DERIVED = "derived"
SAMPLE_SEED = 35
log = logging.getLogger(__name__)


def search_space_configs(configs: Sequence[Any], spec: Any, *, cap: int | None = None) -> list[Any]:
    """The `triton.Config`s a decorator's `search_space=` stands for: `spec` itself (a list),
    or the derived space beyond `configs` ("derived" or a DerivedRule), sampled down to `cap`
    (default KS_SEARCH_MAX_CONFIGS). ValueError naming `search_space` otherwise."""
    if spec is None:
        return []
    if isinstance(spec, (list, tuple)):
        return list(spec)
    if spec == DERIVED:
        rule = DerivedRule()
    elif isinstance(spec, DerivedRule):
        rule = spec
    else:
        raise ValueError(f"search_space: expected a list of triton.Config, {DERIVED!r} or a "
                         f"DerivedRule, got {spec!r}")
    beyond = beyond_list(configs, derived_configs(configs, rule, mode=SpaceMode.DERIVED))
    if cap is None:
        from kernelsearch.service.client_settings import client_settings  # lazily: the server package

        cap = client_settings().search_max_configs
    if len(beyond) > cap:
        beyond = random.Random(SAMPLE_SEED).sample(beyond, cap)
    return [to_triton_config(c) for c in beyond]


def _setting(setting: str | None) -> str:
    if setting is not None:
        return setting
    from kernelsearch.service.client_settings import client_settings

    return client_settings().autotune_serve_searched


def default_search_space() -> str | None:
    """The search space of a kernel whose code gives none (KS_AUTOTUNE_SEARCH_SPACE): "derived"
    or None (the list only); a bad value is warned about by the settings and searches the list."""
    from kernelsearch.service.client_settings import client_settings

    return DERIVED if client_settings().autotune_search_space == DERIVED else None


def serve_searched(*, declared: bool, record: Any = None, setting: str | None = None) -> bool:
    """Whether a winner found beyond the list is served (KS_AUTOTUNE_SERVE_SEARCHED): under
    `auto` a declared kernel's, or an undeclared kernel's `record` with the strict gate's
    evidence (module docstring)."""
    value = _setting(setting)
    if value == "auto":
        return declared or (record is not None and searched_evidence(record))
    return value == "on"


def searched_allowed(setting: str | None = None) -> bool:
    """Whether any searched winner may be served (not KS_AUTOTUNE_SERVE_SEARCHED=off): what a
    call must prepare before it sees the record."""
    return _setting(setting) != "off"


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def searched_evidence(record: Any) -> bool:
    """Whether a searched winner's record shows the strict gate ran it over the key's edges
    (`gate_edges` recorded: every edge the key had, possibly none) and its re-measured gain's
    lower confidence bound is above 1.0."""
    edges, low = _field(record, "gate_edges"), _field(record, "gain_low")
    if not isinstance(edges, int) or isinstance(edges, bool) or edges < 0:
        return False
    if not isinstance(low, (int, float)) or isinstance(low, bool) or not math.isfinite(low):
        return False
    return low > 1.0


def searched_winner(record: Any) -> bool:
    """Whether a record's winner was found beyond the list (`winner_origin` search), from a
    store's record view or a service's record JSON."""
    origin = _field(record, "winner_origin")
    return str(origin) == WinnerOrigin.SEARCH.value


def list_best(timings: Mapping[str, float | None] | None, configs: Sequence[Any]) -> Any | None:
    """The fastest of `configs` (the decorator's list) by a record's own timings, None when the
    record timed none of them: what runs where a searched winner may not be served."""
    timed = [(float(t), i) for i, c in enumerate(configs)
             if (t := (timings or {}).get(canonical_key(c))) is not None and math.isfinite(float(t))]
    return configs[min(timed)[1]] if timed else None


__all__ = ["default_search_space", "search_space_configs", "serve_searched", "searched_allowed", "searched_evidence",
           "searched_winner",
           "list_best", "DERIVED"]
