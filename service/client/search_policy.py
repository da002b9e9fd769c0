"""The user's side of search beyond the list (issue 35): which configs go to the workers, and
whether a searched winner is served.

- `search_space="derived"` (or a `DerivedRule`) on `@kernelsearch.autotune` sends the derived
  space (search_space.derived says what it holds) beyond the list to the workers with the
  call's capture, at most `KS_SEARCH_MAX_CONFIGS` of them (a seeded sample, the same in every
  process). A list of `triton.Config` is sent as given; nothing (the default) searches the list
  only.
- `KS_AUTOTUNE_SERVE_SEARCHED`: a record whose winner lies beyond the list is served where this
  allows it (auto: for declared kernels, not for undeclared ones until their gate has a track
  record); otherwise the call runs the list's best by the record's own timings.
"""
from __future__ import annotations

import math
import random
from typing import Any, Mapping, Sequence

from kernelsearch.db.statuses import WinnerOrigin
from kernelsearch.kernels.configs import canonical_key, to_triton_config
from kernelsearch.search_space.derived import DerivedRule, SpaceMode, beyond_list, derived_configs

DERIVED = "derived"
SAMPLE_SEED = 35


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


def serve_searched(*, declared: bool, setting: str | None = None) -> bool:
    """Whether a winner found beyond the list is served (KS_AUTOTUNE_SERVE_SEARCHED)."""
    if setting is None:
        from kernelsearch.service.client_settings import client_settings

        setting = client_settings().autotune_serve_searched
    value = setting
    if value == "auto":
        return declared
    return value == "on"


def searched_winner(record: Any) -> bool:
    """Whether a record's winner was found beyond the list (`winner_origin` search), from a
    store's record view or a service's record JSON."""
    origin = record.get("winner_origin") if isinstance(record, Mapping) \
        else getattr(record, "winner_origin", None)
    return str(origin) == WinnerOrigin.SEARCH.value


def list_best(timings: Mapping[str, float | None] | None, configs: Sequence[Any]) -> Any | None:
    """The fastest of `configs` (the decorator's list) by a record's own timings, None when the
    record timed none of them: what runs where a searched winner may not be served."""
    timed = [(float(t), i) for i, c in enumerate(configs)
             if (t := (timings or {}).get(canonical_key(c))) is not None and math.isfinite(float(t))]
    return configs[min(timed)[1]] if timed else None


__all__ = ["search_space_configs", "serve_searched", "searched_winner", "list_best", "DERIVED"]
