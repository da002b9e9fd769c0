"""The service's public API names, where cli_serve, tests and docs import them from.

The app itself is built in app.py, its routes live in routers/, their dependencies in deps.py.
"""
from __future__ import annotations

from .app import STATIC_DIR, create_app
from .errors import redact
from .lookups import HIT_WAIT_S, BestCache, LookupTimeout, bounded, lookup_store
from .routers.common import JOB_ID
from .routers.health import store_backend
from .strict_input import BodyLimit
from .views import job_json, record_json

__all__ = ["create_app", "redact", "BestCache", "LookupTimeout", "bounded", "lookup_store",
           "record_json", "job_json", "store_backend", "BodyLimit", "JOB_ID", "HIT_WAIT_S",
           "STATIC_DIR"]
