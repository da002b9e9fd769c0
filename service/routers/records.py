"""/v1/records: the current tuned records, and uploads of records tuned outside the workers."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from kernelsearch.db.store import RecordDoc

from .. import schemas
from ..deps import BestCacheDep, StoreDep, require_writer
from ..lookups import run_read
from ..views import record_json
from .common import ERRORS, WRITE_ERRORS, check_text, kernel_or_404

router = APIRouter(tags=["lookups"])


@router.get("/v1/records", response_model=list[schemas.RecordOut], responses=ERRORS)
async def records(store: StoreDep, kernel: str | None = Query(None, max_length=200),
                  device: str | None = Query(None, max_length=200)) -> Any:
    """The current tuned records, optionally of one kernel and/or one device."""
    if kernel is not None:
        kernel_or_404(kernel)
    if device is not None:
        check_text("device", device)
    found = await run_read(lambda: store.list_records(kernel=kernel, device=device))
    return [record_json(r) for r in found]


@router.post("/v1/records", status_code=201, response_model=schemas.RecordOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def upload_record(body: RecordDoc, store: StoreDep, cache: BestCacheDep) -> Any:
    """Store a record tuned outside the workers (`@kernelsearch.autotune` with
    KS_AUTOTUNE_FALLBACK=tune, on a host whose workers cannot import the kernel); it becomes
    the current record under the same rule as a worker's."""
    k = kernel_or_404(body.kernel)
    try:
        k.validate_axes(body.axes)
    except ValueError as exc:
        raise HTTPException(422, f"axes: {exc}") from None
    rec = body.to_record_in()
    store.ensure_device(rec.device_info or {"name": rec.device})
    view, _ = store.upsert_best(rec)
    cache.invalidate()
    return record_json(view)
