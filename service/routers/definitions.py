"""POST /v1/kernels: an undeclared kernel's definition, sent by `@kernelsearch.autotune` before
it shares what it tuned, so the service can list, gate and serve the kernel; GET
/v1/definitions: the definitions kept, so the CLI knows those kernels through the service."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException

from .. import schemas
from ..definitions import DefinitionConflict, define
from ..deps import StoreDep, require_writer
from .common import WRITE_ERRORS

router = APIRouter(tags=["kernels"])


@router.post("/v1/kernels", status_code=201, response_model=schemas.KernelOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def register_kernel(body: schemas.DefinitionIn, store: StoreDep) -> Any:
    """Register (or update) an undeclared kernel: its identity, key and configs. 409 for a
    declared kernel's name, or for another module's kernel of that name which has records or
    captured calls."""
    try:
        kdef = define(store, body.model_dump())
    except DefinitionConflict as exc:
        raise HTTPException(409, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(422, f"definition: {exc}") from None
    return {**kdef.describe(), "extra_axes": []}


@router.get("/v1/definitions")
def definitions(store: StoreDep) -> Any:
    """Every undeclared kernel's definition the store keeps, by name."""
    return store.kernel_definitions()
