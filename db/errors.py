"""Typed failures of the store, so callers can map them to HTTP codes and CLI messages."""
from __future__ import annotations


class StoreError(Exception):
    """Base of every failure raised by the database layer."""


class SchemaBehind(StoreError):
    """The database's schema is not the one this code was written for."""


class NotFound(StoreError):
    """A named row (job, record, device) does not exist."""


class Conflict(StoreError):
    """The write would break a limit or a rule (e.g. too many queued jobs)."""


class ImportRejected(StoreError):
    """A records document failed validation; nothing of it was imported.

    `index` is the position of the first bad entry in `records` (None for document-level
    problems) and `field` the dotted path of the offending field, when known.
    """

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


class StoreUnavailable(StoreError):
    """The database cannot be reached (refused connection, timeout, locked file...)."""


class LeaseLost(StoreError):
    """A worker wrote on behalf of a job it no longer holds: the job was claimed again (a newer
    attempt), cancelled or finished, or the study's claim was taken over. Nothing was written;
    the worker stops that job and leaves it to whoever holds it now. Never transient."""
