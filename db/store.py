"""The facade every other layer uses: one method, one transaction, plain views out.

`Store` is the repositories of `db.repos` over one engine, so it implements every protocol of
`db.interfaces`; the views, the wire format and the argument checks are re-exported here for the
callers that import them from this module.
"""
from __future__ import annotations

from .checks import axes_key
from .statuses import ACTIVE_STATUSES, FINISHED_STATUSES, JOB_STATUSES
from .repos import ArtifactRepo, DeviceRepo, HelionRepo, JobRepo, KernelRepo, RecordRepo, TransferRepo, TrialRepo
from .views import ImportReport, JobView, RecordFields, RecordIn, RecordView, TrialIn
from .wire import (EXPORT_SCHEMA, EXPORT_VERSION, IMPORT_VERSIONS, AxisValue, DeviceInfoDoc,
                   EntryCheck, RecordDoc, TrialDoc, doc_definitions, parse_records_doc)

__all__ = [
    "Store", "axes_key", "ACTIVE_STATUSES", "FINISHED_STATUSES", "JOB_STATUSES", "ImportReport",
    "JobView", "RecordFields", "RecordIn", "RecordView", "TrialIn", "EXPORT_SCHEMA",
    "EXPORT_VERSION", "IMPORT_VERSIONS", "AxisValue", "DeviceInfoDoc", "EntryCheck", "RecordDoc",
    "TrialDoc", "doc_definitions", "parse_records_doc",
]


class Store(ArtifactRepo, DeviceRepo, JobRepo, TransferRepo, RecordRepo, TrialRepo, KernelRepo, HelionRepo):
    """Jobs, records, devices, trial summaries and Helion's cache entries in one SQL database (SQLite or PostgreSQL)."""
