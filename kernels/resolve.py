"""One key, one answer, and one chain of sources that resolves a key to a tuned config.

Every path that asks "which config for this call?" goes through `Resolver.resolve`: the REST
route (`/v1/best`, over the database), `KernelDef.__call__` (`kernels.provider`), the decorator
and the cache hooks (over the local store and the service). Each caller keeps only its own
policy on top: the route its time bound and nearest-ratio limit, the decorator its recheck and
fallback. Sources are shaped like Helion's cache backends: a small protocol, chained once, with
one back-off for a source that does not answer.

`kernels` knows no database and no HTTP: the sources that reach them are built above
(`service/sources.py`) and handed in.
"""
from __future__ import annotations

import enum
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# The one bound on "nearest": a record tuned for another case is served only while the two cases'
# sizes (`KernelDef.distance`: bytes moved on a log scale) are within this ratio; past it a tuned
# config says little about the shape asked for. Every caller of the resolver (the REST route, the
# decorator, the hooks, `get_kernel`'s provider) gets it; the service's KS_NEAREST_MAX_RATIO sets it
# for its own route.
NEAREST_MAX_RATIO = 32.0


def within(distance: float, max_ratio: float = NEAREST_MAX_RATIO) -> bool:
    """Whether a record at `distance` (a log size ratio) may serve a case under `max_ratio`."""
    return math.isfinite(distance) and distance <= math.log(max_ratio)


# How far another case's record is from this key's case (`KernelDef.distance` bound to the key's
# axes); infinite: never served to it (another dtype, say).
Near = Callable[[Mapping[str, Any]], float]


class Match(str, enum.Enum):
    """How an answer fits its key: tuned for exactly this case, or for the nearest one."""

    EXACT = "exact"
    NEAREST = "nearest"


@dataclass(frozen=True)
class Key:
    """What a config is resolved for: a kernel, its case axes (the tuning key's values), a device.
    An undeclared kernel's axes are Triton's own tuning key: the key arguments' values, then
    every tensor argument's dtype (`arg.dtype`)."""

    kernel: str
    axes: tuple[tuple[str, Any], ...]
    device: str

    @classmethod
    def of(cls, kernel: str, axes: Mapping[str, Any], device: str) -> "Key":
        return cls(kernel, tuple(sorted(axes.items())), device)

    @property
    def axes_dict(self) -> dict[str, Any]:
        return dict(self.axes)


@dataclass(frozen=True)
class Found:
    """A source's answer for a key."""

    config: dict[str, Any]
    match: Match
    source: str  # the answering source's `name`
    source_hash: str | None = None
    # {canonical config key: median us} of every config measured with the record, where kept.
    timings: Mapping[str, float | None] | None = None
    # The answering case's axes and its distance from the key's (0 for an exact answer).
    axes: Mapping[str, Any] = field(default_factory=dict)
    distance: float = 0.0
    # The source's own record (a store's RecordView, a service's JSON), for callers that show it.
    record: Any = field(default=None, repr=False, compare=False)


class SourceUnavailable(Exception):
    """A source could not answer now (its database or service is down): never taken as a miss."""


class ConfigSource(Protocol):
    """Where tuned configs come from (a store, a service). `get` raises `SourceUnavailable` when
    it cannot answer; `known` answers from what it already holds, without asking anyone."""

    name: str

    def get(self, key: Key, near: Near | None, fresh: bool) -> Found | None:
        """The record for exactly this key, else (with `near`) the nearest finite one; None when
        the source, answering, has neither. `fresh`: ask past any snapshot the source keeps."""
        ...

    def known(self, key: Key, near: Near | None) -> Found | None:
        """An answer from what this source already holds (for while it is down), or None."""
        ...


class Resolver:
    """Sources asked in order (the local store before the service: nearer is cheaper). An exact
    answer ends the chain; otherwise the first nearest answer is kept. A source that fails is left
    alone for `retry_s` and answers only from what it already holds. Nothing found while a source
    was down raises `SourceUnavailable`, so a caller never remembers an outage as a miss. A nearest
    answer farther than `max_ratio` (NEAREST_MAX_RATIO) is no answer."""

    def __init__(self, sources: Sequence[ConfigSource], retry_s: float = 30.0,
                 max_ratio: float = NEAREST_MAX_RATIO) -> None:
        self.sources = tuple(sources)
        self.retry_s = retry_s
        self.max_ratio = max_ratio
        self._lock = threading.Lock()
        self._down_until: dict[str, float] = {}

    def down(self, name: str) -> bool:
        """Whether the source `name` is being left alone after a failure."""
        with self._lock:
            return time.monotonic() < self._down_until.get(name, 0.0)

    def reset(self) -> None:
        """Forget every source's failure (a changed environment, tests)."""
        with self._lock:
            self._down_until.clear()

    def failed(self, name: str, exc: BaseException, retry_s: float | None = None) -> None:
        """Leave a source alone for `retry_s` (a caller that used it directly and saw it fail)."""
        wait = self.retry_s if retry_s is None else retry_s
        log.warning("kernelsearch %s unavailable (%s); not asked again for %g s", name, exc, wait)
        with self._lock:
            self._down_until[name] = time.monotonic() + wait

    def resolve(self, key: Key, near: Near | None = None, fresh: bool = False,
                retry_s: float | None = None, max_ratio: float | None = None) -> Found | None:
        """The answer for `key`: exact from the first source that has it, else the first nearest
        within `max_ratio` (the resolver's own by default; only with `near`); None when every
        source answered and none had one."""
        bound = self.max_ratio if max_ratio is None else max_ratio
        nearest: Found | None = None
        unavailable: list[str] = []
        last: SourceUnavailable | None = None
        for src in self.sources:
            got: Found | None
            if self.down(src.name):
                got = src.known(key, near)
                if got is None:
                    unavailable.append(src.name)
            else:
                try:
                    got = src.get(key, near, fresh)
                except SourceUnavailable as exc:
                    last = exc
                    self.failed(src.name, exc, retry_s)
                    unavailable.append(src.name)
                    got = src.known(key, near)
            if got is None:
                continue
            if got.match is Match.EXACT:
                return got
            if nearest is None and near is not None and within(got.distance, bound):
                nearest = got
        if nearest is None and unavailable:
            raise SourceUnavailable(f"no answer for {key.kernel}: {', '.join(unavailable)} "
                                    f"unavailable") from last
        return nearest


def nearest(candidates: Iterable[tuple[float, Mapping[str, Any], T]]) -> tuple[T, float] | None:
    """The one definition of "nearest": of (distance, axes, item) candidates, the item at the
    least finite distance; on a tie, the one whose axes come first in canonical text (sorted keys),
    so the store and the service pick the same record whatever order they list cases in. None
    when no candidate is at a finite distance."""
    best: tuple[float, str, T] | None = None
    for dist, axes, item in candidates:
        if not math.isfinite(dist):
            continue
        text = json.dumps(dict(axes), sort_keys=True, separators=(",", ":"), default=str)
        if best is None or (dist, text) < best[:2]:
            best = (dist, text, item)
    return None if best is None else (best[2], best[0])


def nearest_of(key: Key, near: Near | None,
               candidates: Mapping[tuple, Mapping[str, Any]]) -> tuple[tuple, float] | None:
    """The candidate case (axes tuple -> anything) for `key`: its own, else the `nearest` one by
    `near`; None when there is none."""
    if key.axes in candidates:
        return key.axes, 0.0
    if near is None or not candidates:
        return None
    return nearest((near(dict(a)), dict(a), a) for a in candidates)
