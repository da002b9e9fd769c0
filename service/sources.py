"""A database as a source of tuned configs behind `kernels.resolve.Resolver` (`StoreSource`).

It runs in the server (`/v1/best` reads its database through it) and inside users' programs (the
client's resolver, `kernelsearch.sources`), so this module imports neither FastAPI nor the
server's other modules: the store's protocol and the resolver's types only.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kernelsearch.kernels.resolve import Found, Key, Match, Near, SourceUnavailable

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import RecordRepository

log = logging.getLogger(__name__)


class StoreSource:
    """A database's current records (`find_best`: the exact case, else the nearest by `near`).
    Any error of the database is `SourceUnavailable`: it may come back."""

    name = "store"

    def __init__(self, store: RecordRepository) -> None:
        self.store = store

    def get(self, key: Key, near: Near | None, fresh: bool) -> Found | None:
        def distance(other: dict[str, Any], _work: float) -> float:
            return near(other) if near is not None else float("inf")

        try:
            got = self.store.find_best(key.kernel, key.device, key.axes_dict, distance)
        except Exception as exc:
            raise SourceUnavailable(f"store: {exc}") from exc
        if got is None:
            return None
        record, match = got
        exact = match == Match.EXACT.value
        return Found(dict(record.config), Match.EXACT if exact else Match.NEAREST, self.name,
                     record.source_hash, record.config_timings, dict(record.axes),
                     0.0 if exact or near is None else near(dict(record.axes)), record)

    def known(self, key: Key, near: Near | None) -> Found | None:
        return None
