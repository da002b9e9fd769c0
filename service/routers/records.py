"""/v1/records: the current tuned records, uploads of records tuned outside the workers, and a
record withdrawn."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from kernelsearch.db.wire import RecordDoc
from kernelsearch.kernels.undeclared import MAX_NAME_CHARS
from kernelsearch.search_space.acceptance import RecordRejected, accepted, as_upload

from .. import schemas
from ..definitions import known_or_reloaded
from ..deps import BestCacheDep, StoreDep, require_writer
from ..lookups import run_read
from ..views import record_json
from .common import ERRORS, WRITE_ERRORS, check_text, kernel_or_404

router = APIRouter(tags=["lookups"])

# Who an upload names: the service has one writer token, so an upload made with it is the
# token's, and one to a service without a token is anonymous.
TOKEN_UPLOADER = "api-token"
ANONYMOUS = "anonymous"


@router.get("/v1/records", response_model=list[schemas.RecordOut], responses=ERRORS)
async def records(store: StoreDep, kernel: str | None = Query(None, max_length=MAX_NAME_CHARS),
                  device: str | None = Query(None, max_length=200),
                  history: bool = Query(False, description="the superseded records too")) -> Any:
    """The current tuned records (with `history`, the superseded ones too), optionally of one
    kernel and/or one device."""
    if kernel is not None:
        await run_read(known_or_reloaded, store, kernel)
        kernel_or_404(kernel)
    if device is not None:
        check_text("device", device)
    found = await run_read(lambda: store.list_records(kernel=kernel, device=device,
                                                      include_history=history))
    return [record_json(r) for r in found]


@router.get("/v1/export", responses=ERRORS)
async def export_records(store: StoreDep,
                         kernel: str | None = Query(None, max_length=MAX_NAME_CHARS),
                         device: str | None = Query(None, max_length=200),
                         history: bool = Query(False, description="the superseded records too")
                         ) -> Any:
    """The records as `kernelsearch records export` writes them (schema kernelsearch.records,
    with the undeclared kernels' definitions): what the command answers through the service.
    404 when --kernel or --device names nothing this store knows (a typo)."""
    from ..views import unknown_selection

    def read() -> tuple[dict[str, Any], str | None]:
        doc = store.export_records(kernel=kernel, device=device, include_history=history)
        return doc, (unknown_selection(store, kernel, device) if not doc["records"] else None)

    doc, unknown = await run_read(read)
    if unknown:
        raise HTTPException(404, unknown)
    return doc


def refused(e: RecordRejected) -> HTTPException | RequestValidationError:
    """The acceptance gate's refusal as the API's error: 404 for an unknown kernel, else 422
    naming the field in `errors`."""
    if e.status == 404:
        return HTTPException(404, e.reason)
    return RequestValidationError([{"loc": ("body", *e.field.split(".")), "msg": e.reason,
                                    "type": "value_error"}])


@router.post("/v1/records", status_code=201, response_model=schemas.RecordOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def upload_record(body: RecordDoc, request: Request, store: StoreDep, cache: BestCacheDep) -> Any:
    """Store a record tuned outside the workers (`@kernelsearch.autotune` sharing what it tuned).
    It passes the acceptance gate (search_space.acceptance) and is marked as an upload: who made
    it and from which address (the request's: `origin`, `uploaded_by` and `uploaded_from` in the
    body are ignored). It becomes the current record only against other uploads or none: never
    over a worker's record."""
    token = request.app.state.writer_token
    host = request.client.host if request.client else None
    rec = as_upload(body.to_record_in(), by=TOKEN_UPLOADER if token else ANONYMOUS, host=host)
    try:
        gated = accepted(rec)
    except RecordRejected as e:
        raise refused(e) from None
    rec = gated.value
    store.ensure_device(rec.device_info or {"name": rec.device})
    view, _ = store.upsert_best(gated)
    cache.invalidate()
    return record_json(view)


class WithdrawalOut(BaseModel):
    """A withdrawn record, and the record of its key served now (None: none is)."""

    withdrawn: schemas.RecordOut  # type: ignore[valid-type]
    now_current: schemas.RecordOut | None  # type: ignore[valid-type]


@router.delete("/v1/records/{record_id}", response_model=WithdrawalOut, responses=WRITE_ERRORS,
               dependencies=[Depends(require_writer)])
def withdraw_record(store: StoreDep, cache: BestCacheDep,
                    record_id: int = PathParam(ge=1, le=2**31 - 1, description="a record's id")) -> Any:
    """Withdraw (delete) a record, e.g. a bad upload: when it was current, the best of its case's
    history is served in its place, or nothing. 404 when there is no such record."""
    got = store.withdraw_record(record_id)
    store.drop_orphan_artifact_blobs()  # its compiled kernels went with it (ON DELETE CASCADE)
    cache.invalidate()
    return {"withdrawn": record_json(got.withdrawn),
            "now_current": record_json(got.now_current) if got.now_current else None}
