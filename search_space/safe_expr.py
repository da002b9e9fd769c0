"""A tiny, safe evaluator for the constraint expressions written in the space files.

Constraints are data (strings in TOML), so they must never reach `eval`: this walks Python's AST
and allows only arithmetic, comparisons, boolean logic, names of parameters and a few pure
functions. Anything else is rejected when the space is loaded, not when a trial runs.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Mapping

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos,
                                            ast.Not: operator.not_}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs, "log2": math.log2,
                                         "ceil": math.ceil, "floor": math.floor}
_MAX_POW = 64


class ExprError(ValueError):
    """A constraint expression that is not in the allowed subset, or refers to unknown names."""


class SafeExpr:
    """A parsed constraint: `names` it reads, `evaluate(values)` with no access to Python."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise ExprError("expression: must be a non-empty string")
        self.text = text
        try:
            self._tree = ast.parse(text, mode="eval").body
        except SyntaxError as exc:
            raise ExprError(f"expression {text!r}: {exc.msg}") from None
        self.names: frozenset[str] = frozenset(self._check(self._tree))

    def _check(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)) and node.value is not None:
                raise ExprError(f"expression {self.text!r}: constant {node.value!r} not allowed")
            return set()
        if isinstance(node, ast.Name):
            if node.id in _FUNCS:
                raise ExprError(f"expression {self.text!r}: {node.id} must be called")
            return {node.id}
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self._check(node.left) | self._check(node.right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self._check(node.operand)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self._check(v) for v in node.values))
        if isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
            return set().union(self._check(node.left), *(self._check(c) for c in node.comparators))
        if isinstance(node, ast.IfExp):
            return self._check(node.test) | self._check(node.body) | self._check(node.orelse)
        if isinstance(node, (ast.Tuple, ast.List)):
            return set().union(*(self._check(e) for e in node.elts))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
                and not node.keywords):
            return set().union(*(self._check(a) for a in node.args))
        raise ExprError(f"expression {self.text!r}: {type(node).__name__} is not allowed "
                        f"(arithmetic, comparisons, and/or/not, {', '.join(sorted(_FUNCS))})")

    def evaluate(self, values: Mapping[str, Any]) -> Any:
        missing = self.names - set(values)
        if missing:
            raise ExprError(f"expression {self.text!r}: no value for {', '.join(sorted(missing))}")
        return self._eval(self._tree, values)

    def _eval(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POW:
                raise ExprError(f"expression {self.text!r}: exponent {right} too large")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._eval(node.operand, env))
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(self._eval(v, env) for v in node.values)
            return any(self._eval(v, env) for v in node.values)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comp in zip(node.ops, node.comparators):
                right = self._eval(comp, env)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, env) else node.orelse, env)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self._eval(e, env) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return _FUNCS[node.func.id](*(self._eval(a, env) for a in node.args))
        raise ExprError(f"expression {self.text!r}: cannot evaluate {type(node).__name__}")

    def __repr__(self) -> str:
        return f"SafeExpr({self.text!r})"
