"""Strict reading of what a client sends: body sizes, JSON bodies, query text and integers.

Python's parsers are lax where the API must not be: json reads NaN, Infinity and 1e400 (as inf)
and lone surrogates; int() reads "1_000", " 12 " and Arabic-Indic digits; pydantic's lax mode
turns `true` into 1. A bad value is a 422 naming it, never a 500 from the database or the
encoder further down.
"""
from __future__ import annotations

import email.message
import json
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import Request
from pydantic import BeforeValidator

from kernelsearch.db.portable import MAX_DEPTH, Loc, dotted, first_unportable
from kernelsearch.kernels.spec import KEY_TOKEN_PREFIXES, is_key_token

from .errors import error_response, query_error

_DECIMAL = re.compile(r"-?[0-9]{1,18}")
_DIGITS = re.compile(r"-?[0-9]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def json_problem(body: bytes) -> tuple[Loc, str] | None:
    """Where and why a JSON body must be refused, or None (also None when it is not JSON at all:
    the route's own parsing answers that)."""
    try:
        doc = json.loads(body)  # reads NaN and Infinity, and 1e400 as inf: found below
    except RecursionError:
        return ("body",), f"nested deeper than {MAX_DEPTH} levels"
    except ValueError:
        return None
    return first_unportable(doc, ("body",), max_depth=MAX_DEPTH)


def _is_json(scope: Mapping[str, Any]) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            msg = email.message.Message()
            msg["content-type"] = value.decode("latin-1")
            sub = msg.get_content_subtype()
            return msg.get_content_maintype() == "application" and (sub == "json" or sub.endswith("+json"))
    return False


class StrictJSON:
    """Pure ASGI middleware: a JSON request body with a non-finite number, text that is not
    valid Unicode (or holds NUL), or nesting past db.portable.MAX_DEPTH is answered 422 before
    any route sees it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS") or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        messages = []
        chunks = []
        while True:
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        problem = json_problem(b"".join(chunks))
        if problem:
            loc, why = problem
            resp = error_response(422, f"{dotted(loc)}: {why}",
                                  [{"loc": loc, "msg": why, "type": "value_error"}])
            await resp(scope, _disconnected, send)
            return
        await self.app(scope, replaying(messages, receive), send)


class BodyLimit:
    """Pure ASGI middleware: a request body over `max_bytes` is answered 413 before any parsing."""

    def __init__(self, app: Any, max_bytes: int, larger: dict[str, int] | None = None) -> None:
        """`larger`: route paths with their own bound (compiled kernels' uploads), each a regular
        expression the whole path must match (a path parameter such as a Helion key varies)."""
        self.app = app
        self.max_bytes = max_bytes
        self.larger = [(re.compile(p), n) for p, n in (larger or {}).items()]

    def _limit(self, path: str) -> int:
        return next((n for p, n in self.larger if p.fullmatch(path)), self.max_bytes)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope.get("path", ""))
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(scope, send, 400, "Content-Length is not a number")
                    return
                if declared > limit:
                    await self._reject(scope, send, 413, self._too_big(limit))
                    return
        messages = []
        size = 0
        while True:
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            size += len(msg.get("body", b""))
            if size > limit:
                await self._reject(scope, send, 413, self._too_big(limit))
                return
            if not msg.get("more_body", False):
                break
        await self.app(scope, replaying(messages, receive), send)

    def _too_big(self, limit: int) -> str:
        what = "KS_MAX_BODY_BYTES" if limit == self.max_bytes else "KS_ARTIFACT_MAX_BYTES"
        return f"request body larger than {limit} bytes ({what})"

    @staticmethod
    async def _reject(scope: dict, send: Callable, status: int, detail: str) -> None:
        resp = error_response(status, detail)
        await resp(scope, _disconnected, send)


def replaying(messages: list[dict], receive: Any) -> Any:
    """An ASGI `receive` that hands the app the messages a middleware already read, then the rest."""
    replay = iter(messages)

    async def receive_again() -> dict:
        try:
            return next(replay)
        except StopIteration:
            return await receive()

    return receive_again


async def _disconnected() -> dict:
    return {"type": "http.disconnect"}


async def query_text(request: Request) -> None:
    """App-wide dependency: no control character (NUL above all: PostgreSQL refuses it in text)
    in any query parameter's name or value."""
    for name, value in request.query_params.multi_items():
        for s in (name, value):
            bad = _CONTROL.search(s)
            if bad:
                raise query_error(name, f"query parameter {name!r}: control character "
                                        f"U+{ord(bad.group()):04X} is not allowed")


def integer_problem(v: str) -> str | None:
    """Why query text is not an integer this API reads (None when it is one): ASCII decimal
    digits only, and at most 18 of them."""
    if _DECIMAL.fullmatch(v):
        return None
    if _DIGITS.fullmatch(v):
        return f"must be an integer of at most 18 digits, got {shown_digits(v)}"
    return f"must be an integer written with ASCII digits, got {v[:40]!r}"


def shown_digits(v: str) -> str:
    """A long run of digits, shortened for a message."""
    return v if len(v) <= 24 else f"{v[:20]}... ({len(v.lstrip('-'))} digits)"


def _ascii_int(v: Any) -> Any:
    if isinstance(v, str):
        problem = integer_problem(v)
        if problem:
            raise ValueError(problem)
        return int(v)
    return v


# An int parameter that refuses "1_000", " 12", "12.0" and non-ASCII digits.
AsciiInt = Annotated[int, BeforeValidator(_ascii_int)]


class AxisError(ValueError):
    """A case axis of a query that is refused; `name` is the query parameter at fault."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


def _token_hint(axis: Any, v: str) -> str:
    """How a key value that is no integer is written, for an axis that takes one (an undeclared
    kernel's key): `scale=0.5` is asked for as `scale=float:0.5`."""
    if not axis.tokens:
        return ""
    try:
        example = f"float:{float(v)!r}"
    except ValueError:
        example = f"str:{v[:40]}"
    return (f"; a key value that is no integer is written as a token: {axis.name}={example} "
            f"(prefixes: {', '.join(KEY_TOKEN_PREFIXES)}, or none)")


def parse_case_axes(kdef: Any, raw: Mapping[str, str]) -> dict[str, Any]:
    """Case axes from query text, each checked by the kernel's own Axis.parse and the whole by
    its `validate_axes`; an integer axis only takes ASCII decimal text (Axis.parse alone would
    read " 12"), at most 18 digits. AxisError names the parameter at fault. Informational axes
    (kdef.extra_axes) are left to the caller."""
    names = {a.name for a in kdef.axes}
    for n in raw:
        if n not in names and n not in kdef.extra_axes:
            raise AxisError(f"{kdef.name}: unknown axis {n!r}; axes: {sorted(names)}", n)
    given: dict[str, Any] = {}
    for a in kdef.axes:
        if a.name not in raw:
            raise AxisError(f"{kdef.name}: missing axis {a.name!r}", a.name)
        v: Any = raw[a.name]
        if not a.categorical and not (a.tokens and is_key_token(v)):
            problem = integer_problem(v)
            if problem and _DIGITS.fullmatch(v):
                raise AxisError(f"{kdef.name}: axis {a.name!r}={shown_digits(v)} outside "
                                f"[{a.minimum}, {a.maximum}]", a.name)
            if problem:
                raise AxisError(f"{kdef.name}: axis {a.name!r} {problem}{_token_hint(a, v)}",
                                a.name)
            v = int(v)
        try:
            given[a.name] = a.parse(v, kdef.name)
        except ValueError as exc:
            raise AxisError(str(exc), a.name) from None
    return kdef.validate_axes(given)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def loopback_hosts(port: int) -> frozenset[str]:
    """The Host headers a server bound to loopback on `port` accepts: localhost, 127.0.0.1 and
    [::1] with the port (without it too on port 80). Any other name reaching a loopback server
    came through DNS rebinding from a browser page, not from this machine's user."""
    hosts = {f"{h}:{port}" for h in LOOPBACK_NAMES}
    if port == 80:
        hosts.update(LOOPBACK_NAMES)
    return frozenset(hosts)


def host_allowed(host: str | None, allowed: frozenset[str]) -> bool:
    return (host or "").strip().lower() in allowed


class TrustedHost:
    """Pure ASGI middleware: a request whose Host header is not one of `allowed` is answered 400
    (as Starlette's TrustedHostMiddleware, which mis-reads an IPv6 host with a port)."""

    def __init__(self, app: Any, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = dict(scope.get("headers", ())).get(b"host", b"").decode("latin-1")
        if not host_allowed(host, self.allowed):
            resp = error_response(400, f"Host {host!r} is not served here: this server listens "
                                       f"on loopback and answers {', '.join(sorted(self.allowed))}")
            await resp(scope, _disconnected, send)
            return
        await self.app(scope, receive, send)
