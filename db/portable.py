"""What both backends store as given: JSON-like values SQLite and PostgreSQL agree on.

Python's json reads NaN, Infinity, 1e400 (as inf) and lone surrogates ("\\ud800"); SQLite then
stores some of them while PostgreSQL refuses them (NUL in text, NaN in json, unencodable text),
and an HTTP answer quoting them cannot be encoded. One walk finds the first such value, so the
import and the API refuse it naming where it is.
"""
from __future__ import annotations

import math
from typing import Any


def describe_problem(value: Any) -> str | None:
    """Why a scalar is not portable, or None: non-finite float, NUL or a lone surrogate."""
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number (NaN, Infinity, or beyond a 64-bit float)"
    if isinstance(value, str):
        if "\x00" in value:
            return "text holds a NUL character (U+0000)"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text holds a lone surrogate (not valid Unicode)"
    return None


Loc = tuple[str | int, ...]
# Nesting no document of this project comes near (a record, a capture, Helion's entry: under 8
# levels), well inside what Python's parser and PostgreSQL's json functions recurse through.
MAX_DEPTH = 64


def dotted(loc: Loc) -> str:
    """A location as text: ("records", 3, "device_info", "name") -> records[3].device_info.name."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def first_unportable(value: Any, loc: Loc = (), *, max_depth: int | None = None) -> tuple[Loc, str] | None:
    """(location, reason) of the first non-portable value in nested dicts/lists, keys included,
    or of the first container nested deeper than `max_depth` levels when one is given.

    Iterative, so any nesting depth is fine.
    """
    stack: list[tuple[Loc, Any]] = [(loc, value)]
    while stack:
        where, v = stack.pop()
        if max_depth is not None and isinstance(v, (dict, list, tuple)) and len(where) - len(loc) >= max_depth:
            return where, f"nested deeper than {max_depth} levels"
        if isinstance(v, dict):
            items = list(v.items())
            for k, _ in items:
                why = describe_problem(k)
                if why:
                    return where, f"a field name: {why}"
            stack.extend(((*where, str(k)), x) for k, x in reversed(items))
        elif isinstance(v, (list, tuple)):
            stack.extend(((*where, i), x) for i, x in reversed(list(enumerate(v))))
        else:
            why = describe_problem(v)
            if why:
                return where, why
    return None
