"""The derived search space of a kernel's config list: what a worker searches beyond the list.

"Derived" contains, from a kernel's listed configs (canonical mappings, `triton.Config` fields):

- every meta-parameter whose listed values are all powers of two (ints, not flags): each power
  of two from half its smallest listed value (at least 1) to twice its largest;
- any other meta-parameter (non-power-of-two ints, flags, floats, strings): its listed values;
- `num_warps`: 2, 4, 8, 16 (plus any other value the list uses);
- `num_stages`: 1 to 6 (plus any other value the list uses);
- `num_ctas`, `maxnreg`: their listed values only;
- every listed config, always (first, in the list's order), whatever the rule says.

The space is the product of those choices, so it can be large (a 4-parameter matmul list gives
a few thousand configs); the per-key study samples it within a budget (search_space.key_search),
it never sweeps it.

How a user narrows it or turns it off:
- `DerivedRule(keep=("GROUP_SIZE_M",))` keeps those meta-parameters at their listed values;
  `num_warps=` / `num_stages=` replace the launch-option ranges; `widen=1` keeps every
  power-of-two parameter within its listed range (no halving or doubling);
- `SpaceMode.LIST` (`KS_SEARCH_SPACE=list`) searches the list only: no search beyond it;
- a user-given space replaces the derivation: the decorator's `search_space=` configs, a TOML
  space file (`search_space.space.load_space`), or a rule of one's own (`DerivedRule`).
"""
from __future__ import annotations

import enum
import itertools
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from kernelsearch.kernels.configs import LAUNCH_OPTIONS, canonical, canonical_key

DEFAULT_NUM_WARPS: tuple[int, ...] = (2, 4, 8, 16)
DEFAULT_NUM_STAGES: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
SPACE_ENV = "KS_SEARCH_SPACE"


class SpaceMode(enum.StrEnum):
    """What a worker searches for a key: the derived space, or the list only."""

    DERIVED = "derived"
    LIST = "list"


def space_mode(value: str | None = None) -> SpaceMode:
    """The mode `value` names (default: `KS_SEARCH_SPACE`, else derived); ValueError naming the
    setting otherwise."""
    raw = (value if value is not None else os.environ.get(SPACE_ENV, "")).strip().lower()
    if not raw:
        return SpaceMode.DERIVED
    try:
        return SpaceMode(raw)
    except ValueError:
        raise ValueError(f"{SPACE_ENV}: expected one of {[m.value for m in SpaceMode]}, "
                         f"got {raw!r}") from None


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


@dataclass(frozen=True)
class DerivedRule:
    """How a list widens (module docstring). `widen` is the factor each power-of-two parameter
    reaches below its smallest and above its largest listed value (2: half to twice)."""

    widen: int = 2
    num_warps: tuple[int, ...] = DEFAULT_NUM_WARPS
    num_stages: tuple[int, ...] = DEFAULT_NUM_STAGES
    keep: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _pow2(self.widen):
            raise ValueError(f"widen: expected a power of two >= 1, got {self.widen!r}")
        if not self.num_warps or not all(_pow2(w) for w in self.num_warps):
            raise ValueError(f"num_warps: expected powers of two, got {self.num_warps!r}")
        if not self.num_stages or not all(isinstance(s, int) and s >= 1 for s in self.num_stages):
            raise ValueError(f"num_stages: expected ints >= 1, got {self.num_stages!r}")


def derived_choices(configs: Sequence[Any], rule: DerivedRule = DerivedRule()) -> dict[str, tuple[Any, ...]]:
    """Each parameter's choices in the derived space of `configs` (mappings or triton.Config),
    in ascending order where they are ordered, else in the list's order."""
    listed = [canonical(c) for c in configs]
    if not listed:
        raise ValueError("configs: a derived space needs at least one listed config")
    names: list[str] = []
    for c in listed:
        names += [n for n in c if n not in names]
    out: dict[str, tuple[Any, ...]] = {}
    for n in names:
        seen: list[Any] = []
        for c in listed:
            if n in c and c[n] not in seen:
                seen.append(c[n])
        if n == "num_warps":
            out[n] = tuple(sorted(set(rule.num_warps) | {v for v in seen if isinstance(v, int)}))
        elif n == "num_stages":
            out[n] = tuple(sorted(set(rule.num_stages) | {v for v in seen if isinstance(v, int)}))
        elif n in LAUNCH_OPTIONS or n in rule.keep or not all(_pow2(v) for v in seen):
            out[n] = tuple(seen)
        else:
            lo, hi = max(1, min(seen) // rule.widen), max(seen) * rule.widen
            out[n] = tuple(1 << e for e in range(lo.bit_length() - 1, hi.bit_length()))
    return out


def _product(choices: Mapping[str, Sequence[Any]]) -> Iterator[dict[str, Any]]:
    names = list(choices)
    for values in itertools.product(*(choices[n] for n in names)):
        yield dict(zip(names, values))


def derived_configs(configs: Sequence[Any], rule: DerivedRule = DerivedRule(), *,
                    mode: SpaceMode = SpaceMode.DERIVED) -> list[dict[str, Any]]:
    """The derived space of `configs` as canonical configs: the listed ones first (in order, once
    each), then the rest of the product. `SpaceMode.LIST` gives the list alone."""
    listed = [canonical(c) for c in configs]
    out: dict[str, dict[str, Any]] = {}
    for c in listed:
        out.setdefault(canonical_key(c), c)
    if mode is SpaceMode.LIST:
        return list(out.values())
    for c in _product(derived_choices(listed, rule)):
        out.setdefault(canonical_key(canonical(c)), canonical(c))
    return list(out.values())


def beyond_list(configs: Sequence[Any], space: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The configs of `space` the list does not have (what the decorator's `search_space` holds)."""
    listed = {canonical_key(c) for c in configs}
    return [dict(c) for c in space if canonical_key(c) not in listed]


__all__ = ["DerivedRule", "SpaceMode", "space_mode", "derived_choices", "derived_configs",
           "beyond_list", "DEFAULT_NUM_WARPS", "DEFAULT_NUM_STAGES", "SPACE_ENV"]
