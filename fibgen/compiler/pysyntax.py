"""Python's parser over text taken from a `.fidef`, failing one way only.

`ast.parse` fails in more ways than SyntaxError: a NUL byte is a ValueError, deep nesting a
MemoryError ("too complex") or a RecursionError, and invalid escapes print warnings. Every
embedded expression, parameter list and reference goes through `parse_python`, so a caller
handles one exception type and turns it into a diagnostic.

It also refuses a tree deeper than MAX_DEPTH: Python parses `1+1+...+1` of thousands of
terms, but the tools that then walk the tree recursively (ast.NodeTransformer and
ast.unparse in the emitters, compile()) run out of stack on it, so such text is refused
here, once, instead of crashing whatever reads it later.
"""

from __future__ import annotations

import ast
import warnings
from typing import Literal, Protocol, cast, overload


class PythonSyntaxError(Exception):
    """Text that Python cannot parse: the reason, and where in the text when known."""

    def __init__(self, msg: str, lineno: int | None = None, offset: int | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.lineno = lineno
        self.offset = offset


MAX_DEPTH = 100


@overload
def parse_python(text: str, mode: Literal["eval"]) -> ast.Expression: ...
@overload
def parse_python(text: str, mode: Literal["exec"] = "exec") -> ast.Module: ...
def parse_python(text: str, mode: Literal["exec", "eval"] = "exec") -> ast.mod:
    """``ast.parse(text, mode=mode)``; every failure is a PythonSyntaxError."""
    try:
        with warnings.catch_warnings():
            # "invalid escape sequence" and the like: the text is data here, not a program run.
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode=mode)
    except SyntaxError as exc:  # IndentationError and TabError too
        raise PythonSyntaxError(exc.msg, exc.lineno, exc.offset) from None
    except ValueError as exc:  # "source code string cannot contain null bytes"
        raise PythonSyntaxError(str(exc)) from None
    except (MemoryError, RecursionError):
        raise PythonSyntaxError("too deeply nested for Python's parser") from None
    deepest = _deepest(tree)
    if deepest is not None:
        raise PythonSyntaxError(
            f"nested more than {MAX_DEPTH} levels deep (fibgen's limit)",
            deepest.lineno,
            deepest.col_offset + 1,
        )
    return tree


class _Positioned(Protocol):
    lineno: int
    col_offset: int


def _deepest(tree: ast.AST) -> _Positioned | None:
    """The first node found below MAX_DEPTH levels, or None (an iterative walk)."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH and hasattr(node, "lineno"):
            return cast(_Positioned, node)  # a node with a line has a column too
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return None


def literal_value(text: str) -> object:
    """``ast.literal_eval(text)``; every failure is a PythonSyntaxError."""
    node = parse_python(text, "eval")
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise PythonSyntaxError(f"not a literal: {exc}") from None


def literal_string(text: str) -> str:
    """The value of a Python string literal; a PythonSyntaxError when it is not one."""
    node = parse_python(text, "eval")
    assert isinstance(node, ast.Expression)
    if not isinstance(node.body, ast.Constant) or not isinstance(node.body.value, str):
        raise PythonSyntaxError("not a string literal")
    return node.body.value


def unparse(node: ast.AST) -> str | None:
    """``ast.unparse(node)``, or None when the tree is too deep to print."""
    try:
        return ast.unparse(node)
    except RecursionError:
        return None
