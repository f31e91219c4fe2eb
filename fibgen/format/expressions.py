"""The expression language of constraints and generation hints: checked, then interpreted.

Note [checked expressions]
A constraint (`num_kv_indices == kv_indptr[-1].item()`) and the argument of a generation hint
(`value(1 / sqrt(head_dim))`) are evaluated whenever inputs are made: by `fibgen workloads`,
by bench and by the generated tests, on definitions that come from a `.fidef` or from a
dataset's JSON, which is untrusted input. Python's `eval` cannot be made safe by emptying
`__builtins__`: any object in scope leads back to it (`len.__self__.__import__('os')`, a
tensor's `x.__class__.__init__.__globals__`). So these expressions are not Python run as
such but a small language written in Python's syntax:

- numbers (`1`, `0.5`, `1e-6`), `True` and `False`;
- names of axes, parameters and inputs, and the constants `pi`, `e` and `inf`;
- arithmetic `+ - * / // % **`, unary `-` and `+`, comparisons `== != < <= > >=` (chained
  as in Python), `and`, `or`, `not`;
- an input or a shape subscripted (`x[-1]`, `x[1:]`, `x.shape[0]`), an input's `.shape`, and
  its `.item()`;
- calls of `min max abs int float bool round len sqrt log log2 log10 exp ceil floor`, bare or
  as `math.sqrt`, with positional arguments.

`check_expression` holds text to that list (the compiler reports where it is left, at
file:line:col; the definition model and the sidecar reader refuse the file), and `evaluate`
walks the checked tree itself, never through `eval` or `compile`. Its values are numbers,
strings (parameters), shapes (tuples of ints) and the arrays the caller names (torch tensors
for the runtime); arithmetic takes numbers and arrays only, so no operation can reach an
attribute, build a large sequence (`x.shape * 10**9`) or compute for long on integers
(`9**9**9`): integers stay below 2**4096. Rules and references are Python, and run as such;
the two languages meet nowhere.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from functools import lru_cache
from typing import Any, Callable, Iterator, Mapping

# What an expression may call, and with how many arguments (None: one or more). Those of
# MATH_FUNCTIONS may also be written `math.sqrt(...)`.
MATH_FUNCTIONS = ("sqrt", "log", "log2", "log10", "exp", "ceil", "floor")
FUNCTIONS: dict[str, tuple[Callable[..., Any], int | None]] = {
    "min": (min, None),
    "max": (max, None),
    "abs": (abs, 1),
    "int": (int, 1),
    "float": (float, 1),
    "bool": (bool, 1),
    "round": (round, 1),  # no ndigits: round(5, -10**18) would compute 10**10**18
    "len": (len, 1),
    **{name: (getattr(math, name), 1) for name in MATH_FUNCTIONS},
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "inf": math.inf}

# Names an expression may use besides the definition's axes, parameters and inputs.
BUILTIN_NAMES = frozenset(FUNCTIONS) | frozenset(CONSTANTS) | {"math"}

HELP = (
    "constraints and hints are arithmetic, comparisons and and/or/not over axes, parameters "
    "and inputs, with x[i], x.shape, x.item(), the functions "
    + ", ".join(FUNCTIONS)
    + " and the constants "
    + ", ".join(CONSTANTS)
)

MAX_DEPTH = 100
_MAX_BITS = 4096

_BINARY: dict[type, tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_OPERATOR_TEXT = {
    ast.MatMult: "@",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.Invert: "~",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
# How a construct outside the language is called in a message.
_CONSTRUCTS = {
    ast.Lambda: "a lambda",
    ast.IfExp: "a conditional expression",
    ast.Dict: "a dict",
    ast.Set: "a set",
    ast.List: "a list",
    ast.Tuple: "a tuple",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a generator expression",
    ast.Await: "`await`",
    ast.Yield: "`yield`",
    ast.YieldFrom: "`yield`",
    ast.NamedExpr: "`:=`",
    ast.Starred: "`*` unpacking",
    ast.JoinedStr: "an f-string",
    ast.FormattedValue: "an f-string",
}


class ExpressionError(ValueError):
    """Text outside the expression language: why, and where (1-based line and column, in
    characters of the text, and the width of what is meant)."""

    def __init__(self, message: str, line: int = 1, column: int = 1, width: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.width = width


class EvaluationError(ValueError):
    """A checked expression that has no value for the values it was given."""


# ---------------------------------------------------------------------------------- checking


def check_expression(text: str, what: str = "a constraint") -> None:
    """Raise ExpressionError unless ``text`` is in the language (Note [checked expressions]).

    ``what`` names the expression in messages: "a constraint", "a generation hint".
    """
    _checked(text, what)


def expression_names(text: str) -> list[tuple[str, int, int]]:
    """The free names of a checked expression as (name, line, column), in source order;
    `math` of `math.sqrt` and the names of functions called are left out."""
    tree = _checked(text, "an expression")
    lines, shift_line, shift_col = _layout(text)
    found: list[tuple[str, int, int]] = []
    for node in _walk(tree):
        if isinstance(node, ast.Name):
            line, column, _ = _where(node, lines, shift_line, shift_col)
            found.append((node.id, line, column))
    return found


@lru_cache(maxsize=4096)
def _checked(text: str, what: str) -> ast.expr:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes: the text is data here
            tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(
            f"not an expression: {exc.msg}", exc.lineno or 1, exc.offset or 1
        ) from None
    except (ValueError, MemoryError, RecursionError) as exc:
        raise ExpressionError(f"not an expression: {str(exc) or 'too deeply nested'}") from None
    lines, shift_line, shift_col = _layout(text)
    # Every node is checked and the problem that comes first in the text is reported: in
    # `len.__self__.__import__('os')` that is `.__self__`, not the call around it.
    found: list[tuple[int, int, int, str]] = []
    stack: list[tuple[ast.expr, int]] = [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            found.append((*_where(node, lines, shift_line, shift_col), "it is nested too deeply"))
            break
        problem = _problem(node, what)
        if problem is not None:
            found.append((*_where(node, lines, shift_line, shift_col), problem))
        stack.extend((child, depth + 1) for child in _children(node))
    if found:
        line, column, width, problem = min(found)
        raise ExpressionError(problem, line, column, width)
    return tree.body


def _layout(text: str) -> tuple[list[str], int, int]:
    """The lines of ``text``, and the lines and columns its leading blanks shift the
    positions of the stripped text that is parsed."""
    lead = text[: len(text) - len(text.lstrip())]
    return text.split("\n"), lead.count("\n"), len(lead) - (lead.rfind("\n") + 1)


def _where(node: ast.expr, lines: list[str], shift_line: int, shift_col: int) -> tuple:
    """(line, column, width) of a node in the text; of its name, for an attribute."""
    focus = node.func if isinstance(node, ast.Call) else node
    if not isinstance(focus, ast.Attribute):
        focus = node
    line = focus.lineno + shift_line
    shift = shift_col if focus.lineno == 1 else 0
    end_shift = shift_col if focus.end_lineno == 1 else 0
    column = _column(lines, line, focus.col_offset + shift)
    if focus.end_lineno == focus.lineno:
        assert focus.end_col_offset is not None  # ast.parse sets every node's end
        end = _column(lines, line, focus.end_col_offset + end_shift)
    else:
        end = len(lines[line - 1]) + 1
    if isinstance(focus, ast.Attribute) and focus.end_lineno == focus.lineno:
        # `.name`: from the dot to the end of the name.
        column = max(column, end - len(focus.attr) - 1)
    return line, column, max(1, end - column)


def _column(lines: list[str], line: int, col_offset: int) -> int:
    """The 1-based character column of a UTF-8 byte offset on a line of the text."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    if text.isascii():
        return col_offset + 1
    return len(text.encode("utf-8")[:col_offset].decode("utf-8", errors="ignore")) + 1


def _children(node: ast.AST) -> list[ast.expr]:
    """What is checked below a node: its expressions (a call's function is checked with it,
    a subscript's tuple of indices is no tuple of the language)."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            head = [] if _is_math(func.value) else [func.value]
        else:
            head = [] if isinstance(func, ast.Name) else [func]
        return head + list(node.args) + [k.value for k in node.keywords]
    if isinstance(node, ast.Attribute):
        return [] if _is_math(node.value) else [node.value]
    if isinstance(node, ast.Subscript):
        index = node.slice
        return [node.value] + (list(index.elts) if isinstance(index, ast.Tuple) else [index])
    return [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]


def _walk(tree: ast.expr) -> Iterator[ast.expr]:
    stack: list[ast.expr] = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(_children(node)))


def _is_math(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "math"


def _is_item(func: ast.AST) -> bool:
    return isinstance(func, ast.Attribute) and func.attr == "item" and not _is_math(func.value)


def _problem(node: ast.AST, what: str) -> str | None:
    """Why ``node`` is outside the language, or None."""
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float, bool):
            return None
        kind = {str: "a string", bytes: "a bytes literal", complex: "a complex number"}.get(
            type(node.value), f"`{node.value!r}`"
        )
        return f"{kind} cannot be used in {what}"
    if isinstance(node, ast.Name):
        if node.id == "math":
            return f"`math` is used in {what} only as `math.NAME`, such as `math.sqrt(x)`"
        return None
    if isinstance(node, ast.BinOp):
        return _operator(node.op, what, _BINARY)
    if isinstance(node, ast.UnaryOp):
        return _operator(node.op, what, (ast.UAdd, ast.USub, ast.Not))
    if isinstance(node, (ast.BoolOp, ast.Subscript, ast.Slice)):
        return None
    if isinstance(node, ast.Compare):
        return next((p for p in (_operator(op, what, _COMPARE) for op in node.ops) if p), None)
    if isinstance(node, ast.Attribute):
        if _is_math(node.value):
            if node.attr in CONSTANTS:
                return None
            if node.attr in MATH_FUNCTIONS:
                return f"`math.{node.attr}` is a function: call it"
            return f"`math.{node.attr}` cannot be used in {what}"
        if node.attr == "shape":
            return None
        if node.attr == "item":
            return "`.item` is a method: call it, `.item()`"
        return f"the attribute `.{node.attr}` cannot be used in {what}: only `.shape` and `.item()`"
    if isinstance(node, ast.Call):
        return _call_problem(node, what)
    construct = _CONSTRUCTS.get(type(node), f"`{type(node).__name__}`")
    return f"{construct} cannot be used in {what}"


def _operator(op: ast.AST, what: str, allowed) -> str | None:
    if type(op) in allowed:
        return None
    text = _OPERATOR_TEXT.get(type(op), type(op).__name__)
    return f"the operator `{text}` cannot be used in {what}"


def _call_problem(node: ast.Call, what: str) -> str | None:
    func = node.func
    if _is_item(func):
        return "`.item()` takes no arguments" if node.args or node.keywords else None
    if isinstance(func, ast.Name) and func.id in FUNCTIONS:
        name = func.id
    elif isinstance(func, ast.Attribute) and _is_math(func.value) and func.attr in MATH_FUNCTIONS:
        name = func.attr
    elif isinstance(func, ast.Attribute) and not _is_math(func.value):
        return f"the method `.{func.attr}()` cannot be used in {what}: only `.shape` and `.item()`"
    elif isinstance(func, ast.Name) or isinstance(func, ast.Attribute):
        return f"`{ast.unparse(func)}(...)` is not a function that {what} may call"
    else:
        called = _CONSTRUCTS.get(type(func), "an expression")
        return f"{what} calls functions by their names only, not {called}"
    if node.keywords:
        return f"`{name}` takes no keyword arguments"
    if any(isinstance(a, ast.Starred) for a in node.args):
        return f"`*` unpacking cannot be used in {what}"
    arity = FUNCTIONS[name][1]
    if arity is None and not node.args:
        return f"`{name}` takes at least one argument"
    if arity is not None and len(node.args) != arity:
        return f"`{name}` takes {arity} argument{'s' if arity != 1 else ''}, not {len(node.args)}"
    return None


# -------------------------------------------------------------------------------- evaluation


def evaluate(
    text: str,
    env: Mapping[str, Any],
    arrays: tuple[type[Any], ...] = (),
    what: str = "a constraint",
) -> Any:
    """The value of a checked expression over ``env`` (names to values).

    ``arrays`` are the types of array values (``torch.Tensor``): arithmetic, comparisons,
    subscripts, ``.shape`` and ``.item()`` apply to them. Raises ExpressionError for text
    outside the language and EvaluationError for an expression without a value.
    """
    tree = _checked(text, what)
    try:
        return _Evaluator(env, arrays).value(tree)
    except EvaluationError:
        raise
    except Exception as exc:  # what the values raised (a domain error, a bad index, ...)
        raise EvaluationError(f"{type(exc).__name__}: {exc}") from None


class _Evaluator:
    """Walks a checked tree over one environment (Note [checked expressions])."""

    def __init__(self, env: Mapping[str, Any], arrays: tuple[type[Any], ...]) -> None:
        self.env = env
        self.arrays = arrays

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.BinOp):
            symbol, fn = _BINARY[type(node.op)]
            return self._binary(symbol, fn, self.value(node.left), self.value(node.right))
        if isinstance(node, ast.UnaryOp):
            operand = self.value(node.operand)
            if isinstance(node.op, ast.Not):
                return not operand
            negative = isinstance(node.op, ast.USub)
            self._number_or_array(operand, "-" if negative else "+")
            return -operand if negative else +operand
        if isinstance(node, ast.BoolOp):
            # Python's meaning: the first operand that decides, else the last.
            for operand in node.values[:-1]:
                result = self.value(operand)
                if bool(result) == isinstance(node.op, ast.Or):
                    return result
            return self.value(node.values[-1])
        if isinstance(node, ast.Compare):
            left = self.value(node.left)
            for i, (op, comparator) in enumerate(zip(node.ops, node.comparators)):
                right = self.value(comparator)
                self._same_size(left, right, "a comparison")
                result = _COMPARE[type(op)](left, right)
                if i + 1 < len(node.ops) and not result:
                    return result
                left = right
            return result
        if isinstance(node, ast.Subscript):
            container = self.value(node.value)
            if not (isinstance(container, self.arrays) or type(container) is tuple):
                raise EvaluationError(f"{_kind(container)} cannot be subscripted")
            index = node.slice
            if isinstance(index, ast.Tuple):
                # An array's; a tuple value raises TypeError, which `evaluate` reports.
                key: Any = tuple(self._index(e) for e in index.elts)
                return container[key]
            return container[self._index(index)]
        if isinstance(node, ast.Attribute):
            if _is_math(node.value):
                return CONSTANTS[node.attr]
            owner = self.value(node.value)  # `.shape`, the one attribute the check lets by
            if not isinstance(owner, self.arrays):
                raise EvaluationError(f"{_kind(owner)} has no `.shape`")
            return tuple(int(n) for n in owner.shape)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise EvaluationError(f"`{type(node).__name__}` cannot be evaluated")  # not checked

    def _name(self, name: str) -> Any:
        if name in self.env:
            return self.env[name]
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in FUNCTIONS:
            raise EvaluationError(f"`{name}` is a function: call it")
        raise EvaluationError(f"unknown name `{name}`")

    def _number_or_array(self, value: Any, op: str) -> None:
        if type(value) in (int, float, bool) or isinstance(value, self.arrays):
            return
        raise EvaluationError(f"`{op}` applies to numbers and inputs, not {_kind(value)}")

    def _same_size(self, left: Any, right: Any, what: str) -> None:
        """Refuse two arrays that broadcast to more elements than either holds: `a * b` of
        shapes [n, 1] and [m] would make n * m of them."""
        if not (isinstance(left, self.arrays) and isinstance(right, self.arrays)):
            return
        a, b = tuple(left.shape), tuple(right.shape)
        if a == b:
            return
        width = max(len(a), len(b))
        a, b = (1,) * (width - len(a)) + a, (1,) * (width - len(b)) + b
        result = math.prod(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b))
        if result > max(math.prod(a), math.prod(b)):
            raise EvaluationError(
                f"{what} of inputs of shapes {list(left.shape)} and {list(right.shape)} "
                f"would make {result} elements"
            )

    def _binary(self, symbol: str, fn: Callable[[Any, Any], Any], left: Any, right: Any) -> Any:
        self._number_or_array(left, symbol)
        self._number_or_array(right, symbol)
        self._same_size(left, right, f"`{symbol}`")
        ints = type(left) in (int, bool) and type(right) in (int, bool)
        if ints and symbol == "**" and abs(left) > 1 and right > 0:
            if right * math.log2(abs(left)) > _MAX_BITS:
                raise EvaluationError(f"{left} ** {right} is too large")
        result = fn(left, right)
        if type(result) is int and result.bit_length() > _MAX_BITS:
            raise EvaluationError(f"an integer of more than {_MAX_BITS} bits")
        return result

    def _index(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Slice):
            bounds = (node.lower, node.upper, node.step)
            return slice(*(None if b is None else self._integer(self.value(b)) for b in bounds))
        value = self.value(node)
        return value if isinstance(value, self.arrays) else self._integer(value)

    def _integer(self, value: Any) -> int:
        if type(value) not in (int, bool):
            raise EvaluationError(f"an index is an integer, not {_kind(value)}")
        return value

    def _call(self, node: ast.Call) -> Any:
        func = node.func
        if _is_item(func):
            owner = self.value(func.value)  # type: ignore[attr-defined]
            if not isinstance(owner, self.arrays):
                raise EvaluationError(f"{_kind(owner)} has no `.item()`")
            return owner.item()
        name = func.id if isinstance(func, ast.Name) else func.attr  # type: ignore[attr-defined]
        fn, _ = FUNCTIONS[name]
        args = [self.value(a) for a in node.args]
        if name in ("min", "max") and len(args) == 1:
            if type(args[0]) is not tuple:
                raise EvaluationError(f"`{name}` of one value takes a shape")
        elif name == "len":
            if not (type(args[0]) is tuple or isinstance(args[0], self.arrays)):
                raise EvaluationError(f"`len` takes an input or a shape, not {_kind(args[0])}")
        else:
            numbers_only = name in ("min", "max", "round")
            for arg in args:
                if not (
                    type(arg) in (int, float, bool)
                    or (isinstance(arg, self.arrays) and not numbers_only)
                ):
                    raise EvaluationError(f"`{name}` cannot take {_kind(arg)}")
        return fn(*args)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, tuple):
        return "a shape"
    if value is None:
        return "None"
    return f"a {type(value).__name__}"
