"""A job's statuses, apart from the models so that the HTTP client can name them without SQLAlchemy.

A job is active while it waits or runs; the finished statuses are final.
"""
from __future__ import annotations

ACTIVE_STATUSES = ("queued", "running")
FINISHED_STATUSES = ("succeeded", "failed", "cancelled")
JOB_STATUSES = ACTIVE_STATUSES + FINISHED_STATUSES

# Where a record came from: a worker's study, an upload by a user's process (`POST /v1/records`,
# `@kernelsearch.autotune` sharing), or a records file (`kernelsearch records import`). An upload
# never supersedes a record of another origin (db.repos.records).
RECORD_ORIGINS = ("worker", "upload", "import")
UPLOAD_ORIGIN = "upload"
