"""Helion's autotune cache entries (`interfaces.HelionEntries`), under Helion's own cache keys:
a read gives back exactly the text that was stored."""
from __future__ import annotations

from dataclasses import asdict, fields

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..errors import Conflict, NotFound
from ..models import ArtifactSet, HelionEntry, utcnow
from ..statuses import RecordOrigin
from ..views import Accepted, HelionEntryIn, HelionEntryView, accepted_value
from ._base import RepoBase

_COLUMNS = tuple(f.name for f in fields(HelionEntryView))
MAX_LIST = 1000


def _view(row: HelionEntry) -> HelionEntryView:
    return HelionEntryView(**{c: getattr(row, c) for c in _COLUMNS})


def outranks(stored: str, new: str) -> bool:
    """Whether a stored entry of origin `stored` stays against a new one of origin `new`: a
    worker's against an upload (as records rank, db.repos.records.rank)."""
    return stored != RecordOrigin.UPLOAD and new == RecordOrigin.UPLOAD


class HelionRepo(RepoBase):
    def put_helion_entry(self, entry: Accepted[HelionEntryIn]) -> HelionEntryView:
        """Store an entry the gate passed (`search_space.acceptance.accepted_helion`), replacing
        the one under the same cache key (Helion writes a key again when it tunes it again: the
        newest config is the one it uses), unless that one is a worker's and this an upload:
        Conflict then, and the worker's entry stays."""
        gated = accepted_value(entry, "entry", HelionEntryIn)

        def tx(s: Session) -> HelionEntryView:
            row = s.execute(select(HelionEntry).where(HelionEntry.cache_key == gated.cache_key)
                            .with_for_update()).scalar_one_or_none()
            values = asdict(gated)
            if row is not None and outranks(row.origin, gated.origin):
                raise Conflict(f"{gated.cache_key}: a worker tuned the entry under this key; an "
                               f"upload does not replace it")
            if row is None:
                row = HelionEntry(**values)
                s.add(row)
            else:
                if row.config != values["config"]:  # its compiled kernels are another config's
                    s.execute(delete(ArtifactSet).where(ArtifactSet.helion_entry_id == row.id))
                for k, v in values.items():
                    setattr(row, k, v)
                row.updated_at = utcnow()
            s.flush()
            return _view(row)

        return self._tx(tx, write=True)

    def withdraw_helion_entry(self, cache_key: str) -> HelionEntryView:
        """Delete the entry under Helion's cache key, and with it its compiled kernels (ON DELETE
        CASCADE); NotFound when there is none."""
        def tx(s: Session) -> HelionEntryView:
            row = s.execute(select(HelionEntry).where(HelionEntry.cache_key == cache_key)
                            .with_for_update()).scalar_one_or_none()
            if row is None:
                raise NotFound(f"no Helion entry under {cache_key}")
            gone = _view(row)
            s.execute(delete(HelionEntry).where(HelionEntry.id == row.id)
                      .execution_options(synchronize_session=False))
            return gone

        return self._tx(tx, write=True)

    def get_helion_entry(self, cache_key: str) -> HelionEntryView | None:
        def q(s: Session) -> HelionEntryView | None:
            row = s.execute(select(HelionEntry).where(HelionEntry.cache_key == cache_key)).scalar_one_or_none()
            return None if row is None else _view(row)

        return self._tx(q, write=False)

    def list_helion_entries(self, limit: int = 100, *, kernel: str | None = None,
                            hardware: str | None = None) -> list[HelionEntryView]:
        """The newest entries first (as Helion's warm start reads them), at most `limit`."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
            raise ValueError(f"limit: expected an int in 1..{MAX_LIST}, got {limit!r}")

        def q(s: Session) -> list[HelionEntryView]:
            stmt = select(HelionEntry)
            if kernel is not None:
                stmt = stmt.where(HelionEntry.kernel == kernel)
            if hardware is not None:
                stmt = stmt.where(HelionEntry.hardware == hardware)
            rows = s.execute(stmt.order_by(HelionEntry.updated_at.desc(), HelionEntry.id.desc())
                             .limit(limit)).scalars().all()
            return [_view(r) for r in rows]

        return self._tx(q, write=False)
