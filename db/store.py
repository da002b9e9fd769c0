"""The facade every other layer uses: one method, one transaction, plain views out.

`Store` is the repositories of `db.repos` over one engine, so it implements every protocol of
`db.interfaces`. The types it takes and gives have one home each: `db.views` (the views),
`db.wire` (the records file), `db.checks`, `db.statuses`.
"""
from __future__ import annotations

from .repos import ArtifactRepo, DeviceRepo, HelionRepo, JobRepo, KernelRepo, RecordRepo, TransferRepo, TrialRepo

__all__ = ["Store"]


class Store(ArtifactRepo, DeviceRepo, JobRepo, TransferRepo, RecordRepo, TrialRepo, KernelRepo, HelionRepo):
    """Jobs, records, devices, trial summaries and Helion's cache entries in one SQL database (SQLite or PostgreSQL)."""
