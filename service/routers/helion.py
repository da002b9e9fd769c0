"""/v1/helion/entries: Helion's autotune cache (`kernelsearch.helion`, a `RemoteCacheBackend`):
an entry stored under Helion's own cache key, read back exactly, and the newest entries listed
for Helion's warm start. /v1/helion/jobs: a miss queued for a worker to tune."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam

from kernelsearch.db import errors as dberr
from kernelsearch.db.views import HelionEntryView
from kernelsearch.search_space.acceptance import RecordRejected, accepted_helion

from .. import schemas
from ..deps import SettingsDep, StoreDep, require_writer
from kernelsearch.search_space.job_acceptance import JobRefused, accept_helion_job
from ..lookups import run_read
from ..views import job_json
from .common import ERRORS, WRITE_ERRORS, check_text
from .records import ANONYMOUS, TOKEN_UPLOADER, refused

router = APIRouter(tags=["helion"])

KEY = PathParam(pattern="^[0-9a-f]{64}$", description="Helion's cache key (sha256 of its key, hex)")


def entry_json(e: HelionEntryView) -> dict[str, Any]:
    d = e.as_dict()
    d["key"] = d.pop("cache_key")
    return d


@router.put("/v1/helion/entries/{key}", response_model=schemas.HelionEntryOut,
            responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def put_entry(body: schemas.HelionEntryIn, request: Request, store: StoreDep, key: str = KEY) -> Any:
    """Store Helion's entry under its cache key (replacing the key's upload), once the acceptance
    gate has read it: Helion's key fields, whose hash (as Helion computes it) is the key, a
    config, and Helion's accuracy check not turned off. 409 when a worker tuned the key's entry:
    an upload never replaces it."""
    token = request.app.state.writer_token
    try:
        entry = accepted_helion(key, body.data, kernel=body.kernel, arg_names=body.arg_names,
                                checked=body.checked, by=TOKEN_UPLOADER if token else ANONYMOUS,
                                host=request.client.host if request.client else None)
    except RecordRejected as e:
        raise refused(e) from None
    try:
        return entry_json(store.put_helion_entry(entry))
    except dberr.Conflict as e:
        raise HTTPException(409, str(e)) from None


@router.delete("/v1/helion/entries/{key}", response_model=schemas.HelionEntryOut,
               responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def withdraw_entry(store: StoreDep, key: str = KEY) -> Any:
    """Withdraw the entry under Helion's cache key, and its compiled kernels with it; 404 when
    there is none."""
    try:
        gone = store.withdraw_helion_entry(key)
    except dberr.NotFound as e:
        raise HTTPException(404, str(e)) from None
    store.drop_orphan_artifact_blobs()  # its compiled kernels went with it (ON DELETE CASCADE)
    return entry_json(gone)


@router.get("/v1/helion/entries/{key}", response_model=schemas.HelionEntryOut, responses=ERRORS)
async def get_entry(store: StoreDep, key: str = KEY) -> Any:
    """The entry stored under Helion's cache key; 404 when there is none."""
    got = await run_read(store.get_helion_entry, key)
    if got is None:
        raise HTTPException(404, f"no Helion entry under {key}")
    return entry_json(got)


@router.get("/v1/helion/entries", response_model=list[schemas.HelionEntryOut], responses=ERRORS)
async def list_entries(store: StoreDep, limit: int = Query(100, ge=1, le=1000),
                       kernel: str | None = Query(None, max_length=200),
                       hardware: str | None = Query(None, max_length=200)) -> Any:
    """The newest entries first (Helion's warm start reads them), optionally of one kernel
    (`helion:module.qualname`) or one hardware."""
    for name, v in (("kernel", kernel), ("hardware", hardware)):
        if v is not None:
            check_text(name, v)
    got = await run_read(lambda: store.list_helion_entries(limit, kernel=kernel, hardware=hardware))
    return [entry_json(e) for e in got]


@router.post("/v1/helion/jobs", status_code=202, response_model=schemas.JobSubmitted,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def submit_job(body: schemas.HelionJobIn, settings: SettingsDep, store: StoreDep) -> Any:
    """Queue a worker's tuning of a Helion cache miss from the call's capture; the worker stores
    the entry under the key. 202 with the job and `"existing": false`, or `"existing": true` with
    the key's job already queued or running, or failed less than KS_HELION_FAILED_RETRY_S ago
    (a call no worker can tune is not queued again on every miss)."""
    try:
        queued, existing = accept_helion_job(store, settings, body.key, body.capture)
    except JobRefused as e:
        raise HTTPException(e.status, str(e)) from None
    return {**job_json(queued), "existing": existing}
