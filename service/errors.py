"""The API's one error shape (`schemas.Message`) and the handlers that give it to every 4xx/5xx.

FastAPI answers HTTPException with a string `detail` and validation errors with pydantic's list
(which also echoes the input, so a NaN or a lone surrogate in it made the answer itself fail to
encode: a 500). Here both become {"detail": "<sentence>", "errors": [{"loc", "msg", "type"}]}.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kernelsearch.db import errors as dberr
from kernelsearch.db.engine import redact_url_passwords

# Database URLs quoted in messages and logs lose their passwords.
redact = redact_url_passwords


def _text(s: Any) -> str:
    # Anything quoted back must encode as UTF-8, even a lone surrogate from the request.
    return str(s).encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(detail: Any, errors: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The body of every error answer (schemas.Message): a sentence and the per-field errors."""
    return {
        "detail": _text(detail),
        "errors": [{"loc": [p if isinstance(p, int) else _text(p) for p in e.get("loc", ())],
                    "msg": _text(e.get("msg", "")), "type": _text(e.get("type", ""))}
                   for e in errors],
    }


def error_response(status: int, detail: Any, errors: Iterable[Mapping[str, Any]] = (),
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(detail, errors), status_code=status,
                        headers=dict(headers) if headers else None)


def validation_detail(errors: Iterable[Mapping[str, Any]]) -> str:
    """One sentence for pydantic's errors: `body.n_trials: Input should be greater than 0; ...`."""
    parts = []
    for e in errors:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg', '')}" if loc else str(e.get("msg", "")))
    return "; ".join(parts) or "invalid request"


def install(app: FastAPI) -> None:
    """Route HTTPException (FastAPI's, Starlette's 404/405), validation errors and the store's
    failures to the shape: an unreachable database or one behind the code's schema is a 503
    (every route, until it is back), a row the store does not have a 404."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, exc.detail, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        return error_response(422, validation_detail(errors), errors)

    @app.exception_handler(dberr.StoreUnavailable)
    async def _unavailable(request: Request, exc: dberr.StoreUnavailable) -> JSONResponse:
        return error_response(503, redact(str(exc)) or "database unavailable",
                              headers={"Retry-After": "5"})

    @app.exception_handler(dberr.SchemaBehind)
    async def _schema(request: Request, exc: dberr.SchemaBehind) -> JSONResponse:
        return error_response(503, str(exc))

    @app.exception_handler(dberr.NotFound)
    async def _not_found(request: Request, exc: dberr.NotFound) -> JSONResponse:
        return error_response(404, str(exc))
