"""Every status the store keeps, as str enums apart from the models, so that the HTTP client can
name them without SQLAlchemy and a misspelt status fails the type check. A member is its own
value (`JobStatus.QUEUED == "queued"`, and JSON, SQL and f-strings see "queued"), so rows, JSON
and the API read as they always did.

A job is active while it waits or runs; the finished statuses are final.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Plain strings, for `Literal[...]` types and the schema's CHECK constraint.
ACTIVE_STATUSES: tuple[str, ...] = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
FINISHED_STATUSES: tuple[str, ...] = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value,
                                      JobStatus.CANCELLED.value)
JOB_STATUSES: tuple[str, ...] = ACTIVE_STATUSES + FINISHED_STATUSES


class JobKind(enum.StrEnum):
    """What a job runs, set once at submission from what was submitted (`job_kind`); the worker
    has one handler per kind. DECLARED: Optuna tunes a registered kernel's cases. CAPTURE: Optuna
    tunes an undeclared kernel on a call's capture. SEARCH: a captured key searched beyond its
    config list. HELION: Helion's own autotuner on a captured call."""

    DECLARED = "declared"
    CAPTURE = "capture"
    SEARCH = "search"
    HELION = "helion"


JOB_KINDS: tuple[str, ...] = tuple(k.value for k in JobKind)
# What a submission carries that says its kind: a search job's sampler, a Helion capture's kind.
SEARCH_SAMPLER = "search"
HELION_CAPTURE = "helion"


def job_kind(sampler: str, capture: Mapping[str, Any] | None) -> JobKind:
    """The kind of a job submitted with this sampler and capture (the store sets it so; the
    migration that added the column set older jobs' so)."""
    if capture is None:
        return JobKind.DECLARED
    if capture.get("kind") == HELION_CAPTURE:
        return JobKind.HELION
    if sampler == SEARCH_SAMPLER:
        return JobKind.SEARCH
    return JobKind.CAPTURE


class RecordOrigin(enum.StrEnum):
    """Where a record came from: a worker's study, an upload by a user's process
    (`POST /v1/records`, `@kernelsearch.autotune` sharing), or a records file (`kernelsearch
    records import`). An upload never supersedes a record of another origin (db.repos.records)."""

    WORKER = "worker"
    UPLOAD = "upload"
    IMPORT = "import"


RECORD_ORIGINS: tuple[str, ...] = tuple(o.value for o in RecordOrigin)


class WinnerOrigin(enum.StrEnum):
    """Where a record's winner came from: the kernel's own config list, or a search beyond it
    (search_space.derived). A searched winner is served only where the user allows it
    (KS_AUTOTUNE_SERVE_SEARCHED) and carries its gain over the list's best."""

    LIST = "list"
    SEARCH = "search"


WINNER_ORIGINS: tuple[str, ...] = tuple(o.value for o in WinnerOrigin)


class TrialStatus(enum.StrEnum):
    """How a trial of a record's study ended, as its summary (ks_trial_summaries) and an export
    say it: measured, or failed (rejected, failed to compile, wrong, timed out...)."""

    COMPLETE = "complete"
    FAIL = "fail"


TRIAL_STATES: tuple[str, ...] = tuple(t.value for t in TrialStatus)
