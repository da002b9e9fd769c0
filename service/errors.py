"""The API's one error shape (`schemas.Message`) and the handlers that give it to every 4xx/5xx.

FastAPI answers HTTPException with a string `detail` and validation errors with pydantic's list
(which also echoes the input, so a NaN or a lone surrogate in it made the answer itself fail to
encode: a 500). Here both become {"detail": "<sentence>", "errors": [{"loc", "msg", "type"}]}.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

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


class InputError(HTTPException):
    """A 4xx about named inputs: `errors` lists each as {loc, msg, type}, as a validation
    error's do (a query parameter checked by hand gets the same shape as one pydantic checked)."""

    def __init__(self, status: int, detail: str, errors: Iterable[Mapping[str, Any]]) -> None:
        super().__init__(status, detail)
        self.errors = list(errors)


def query_error(name: str, msg: str, status: int = 422) -> InputError:
    """The 422 for query parameter `name`: `msg` as the detail and its one error."""
    return InputError(status, msg, [{"loc": ["query", name], "msg": msg, "type": "value_error"}])


def error_response(status: int, detail: Any, errors: Iterable[Mapping[str, Any]] = (),
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(detail, errors), status_code=status,
                        headers=dict(headers) if headers else None)


# A location step that names a branch of a union (list[...], literal['all'], int, str), not a field.
_UNION_TAG = re.compile(r"^(?:[a-z-]+\[.*\]|int|str|float|bool|bytes|none|function-[a-z-]+)$")


def simplify_errors(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors of a union reported as a user would read them: only the branch that
    got furthest into the input (the list the client sent, not the literal "all" it did not),
    branch names dropped from each location, alternatives at one location joined with "or"."""
    errs = [dict(e) for e in errors]
    if not any(any(isinstance(p, str) and _UNION_TAG.match(p) for p in e.get("loc", ())) for e in errs):
        return errs
    def prefix(e: Mapping[str, Any]) -> tuple:
        loc = tuple(e.get("loc", ()))
        for i, p in enumerate(loc):
            if isinstance(p, str) and _UNION_TAG.match(p):
                return loc[:i]
        return loc
    deepest: dict[tuple, int] = {}
    for e in errs:
        deepest[prefix(e)] = max(deepest.get(prefix(e), 0), len(e.get("loc", ())))
    merged: dict[tuple, dict[str, Any]] = {}
    for e in errs:
        if len(e.get("loc", ())) < deepest[prefix(e)]:
            continue
        loc = tuple(p for p in e.get("loc", ()) if not (isinstance(p, str) and _UNION_TAG.match(p)))
        msg = str(e.get("msg", ""))
        if loc in merged:
            prev = merged[loc]
            prev["msg"] = f"{prev['msg']} or {msg.removeprefix('Input should be ')}"
            continue
        merged[loc] = {**e, "loc": list(loc), "msg": msg}
    out = list(merged.values())
    for e in out:
        got = e.get("input")
        if isinstance(got, (int, float, str)) and not isinstance(got, bool) and len(str(got)) <= 40:
            e["msg"] = f"{e['msg']}, got {got!r}"
    return out


def leaf_routes(routes: Iterable[Any]) -> Iterator[Any]:
    """The app's routes with the routers FastAPI includes opened up (it keeps an included
    router as one entry; ours are included without a prefix, so their own routes match as is)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from leaf_routes(inner.routes)
        else:
            yield route


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers at this request's path (Starlette's 405 names
    only those of the first route that matched the path)."""
    methods: set[str] = set()
    for route in leaf_routes(request.app.routes):
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


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
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        return error_response(exc.status_code, exc.detail, getattr(exc, "errors", ()),
                              headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = simplify_errors(exc.errors())
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
