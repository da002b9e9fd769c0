"""A job's statuses, apart from the models so that the HTTP client can name them without SQLAlchemy.

A job is active while it waits or runs; the finished statuses are final.
"""
from __future__ import annotations

ACTIVE_STATUSES = ("queued", "running")
FINISHED_STATUSES = ("succeeded", "failed", "cancelled")
JOB_STATUSES = ACTIVE_STATUSES + FINISHED_STATUSES
