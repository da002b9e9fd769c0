"""What several routers share: the documented error answers, the job id parameter, and the
kernel and text checks every route applies the same way."""
from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from fastapi import Path as PathParam

from kernelsearch import kernels

from .. import schemas
from ..errors import query_error

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.Message}, 404: {"model": schemas.Message},
    422: {"model": schemas.Message}, 503: {"model": schemas.Message}}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS, 401: {"model": schemas.Message}, 409: {"model": schemas.Message},
    413: {"model": schemas.Message}, 429: {"model": schemas.Message}}
JOB_ID = PathParam(ge=1, le=2**31 - 1, description="a job's id")


def kernel_or_404(name: str, store: Any = None) -> kernels.KernelDef:
    """The kernel of that name, else 404 naming the known ones. With `store` (a route that may
    read the database here, outside the event loop), a name this process does not know is
    looked up among the store's undeclared kernels first (`definitions.known_or_reloaded`)."""
    if store is not None:
        from ..definitions import known_or_reloaded

        known_or_reloaded(store, name)
    try:
        return kernels.get_kernel(name)
    except KeyError as exc:
        raise HTTPException(404, exc.args[0]) from None


def check_text(name: str, value: str) -> None:
    """Reject control characters (PostgreSQL refuses NUL in text) and absurd lengths: 422
    naming the query parameter."""
    if len(value) > 200 or any(ord(ch) < 32 for ch in value):
        raise query_error(name, f"{name}: at most 200 printable characters")
