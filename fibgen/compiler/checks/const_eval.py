"""Derived consts computed at compile time by a small, bounded interpreter."""

from __future__ import annotations

import ast
import enum
import math
import operator
from typing import Any, Callable, Final, Literal

from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python

# Note [const arithmetic]: a derived const is computed at compile time from values the
# .fidef gives, by a small interpreter rather than by eval: arithmetic on numbers whose
# magnitude stays below _BOUND, and the functions below, each cheap on such numbers. So no
# expression can make the compiler compute for long or run out of memory (`9**9**9`,
# `factorial(10**9)`); a value out of range is a diagnostic.
INT64_MAX = 2**63 - 1
_BOUND = 2**64
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str | None, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "round": lambda x: round(x),  # no ndigits: round(5, -10**18) would compute 10**10**18
    **{
        name: getattr(math, name)
        for name in (
            "ceil floor trunc sqrt isqrt log log2 log10 exp gcd lcm fabs pow copysign hypot"
        ).split()
    },
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


class _Unparsable(enum.Enum):
    """What `evaluate_const` gives for text that is not an expression (lowering reported it).
    A one-member enum, so that `is UNPARSABLE` narrows the result's type."""

    UNPARSABLE = "unparsable"


UNPARSABLE: Final = _Unparsable.UNPARSABLE


class _ConstError(Exception):
    pass


def evaluate_const(text: str, names: dict) -> int | float | str | Literal[_Unparsable.UNPARSABLE]:
    """Evaluate a const expression over already-known values (Note [const arithmetic]).

    Returns the value, `UNPARSABLE`, or a `<reason>` string for an expression that has no
    value.
    """
    try:
        tree = parse_python(text, "eval")
    except PythonSyntaxError:
        return UNPARSABLE
    assert isinstance(tree, ast.Expression)
    try:
        return _eval_node(tree.body, names)
    except _ConstError as exc:
        return f"<{exc}>"
    except RecursionError:
        return "<the expression is nested too deeply>"
    except (ArithmeticError, ValueError, TypeError) as exc:
        return f"<{type(exc).__name__}: {exc}>"


def _eval_node(node: ast.expr, names: dict) -> int | float:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise _ConstError(f"{node.value!r} is not a number")
        return _bounded(node.value)
    if isinstance(node, ast.Name):
        if node.id in names:
            return _bounded(names[node.id])
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise _ConstError(f"`{node.id}` has no value here")
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "math":
            if node.attr in _CONSTANTS:
                return _CONSTANTS[node.attr]
        raise _ConstError(f"`{ast.unparse(node)}` cannot be used in a const")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_eval_node(node.operand, names)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left, names), _eval_node(node.right, names)
        if isinstance(node.op, ast.Pow) and abs(left) > 1 and abs(right) > 64:
            raise _ConstError("the power is too large")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call):
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else None
        if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
            name = fn.attr if fn.value.id == "math" else None
        if name not in _FUNCTIONS or node.keywords:
            raise _ConstError(f"`{ast.unparse(fn)}(...)` cannot be used in a const")
        args = [_eval_node(a, names) for a in node.args]
        return _bounded(_FUNCTIONS[name](*args))
    raise _ConstError(f"`{type(node).__name__}` is not allowed in a const")


def _bounded(value: object) -> int | float:
    if type(value) is bool or not isinstance(value, (int, float)):
        raise _ConstError(f"{value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise _ConstError(f"the value is {value}")
    if abs(value) > _BOUND:
        raise _ConstError("the value is too large for a size")
    return value
