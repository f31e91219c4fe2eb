"""Families that stand for one API: a call must be able to tell which of them it is for.

Families outside dispatch groups that declare the same `api` form a chain in source order, as
do the families of one dispatch case; the generated dispatchers offer a call to each in turn
(Note [the dispatch contract] in ``fibgen/runtime/routing/apply.py``). A family takes a call whose
key its instances declare, or whose name its name rule spells when no other family declares
that name. Two families that spell names alike can therefore both claim a call no instance
declares; that is harmless when they take the same inputs and outputs, and an error when
they do not, unless the earlier one has a rule the later one lacks (``page_size == 1``),
which keeps the calls it cannot serve away from it.

Rules are compared as expressions (their syntax trees, so spacing does not matter), not by
what they mean. A rule that keeps calls away must read the call: one that mentions no
argument of it (``True``, ``math.pi > 3``, a condition on the instance's constants alone)
has the same value for every call, so it tells no two calls apart, and it is refused where
it is all that sets a family apart; so is a bound no size can fail (``q.shape[0] >= 0``).
Beyond that, a rule over an argument is taken at its word: whether some call can fail a
condition such as ``q.shape[0] + 1 > 0`` is a question about every value a program may
pass, which no checker answers in general, just as fibgen does not prove a reference
right. What a rule says is checked where it runs: the generated dispatcher evaluates it on
every call, and the generated tests and the GPU conformance suite show which family each
call reaches.
"""

from __future__ import annotations

import ast
import string
from collections.abc import Callable

from fibgen.compiler import ir, rules

Report = Callable[[str, ir.Span | None, str | None], None]


def _contract(fam: ir.Family) -> tuple:
    """What a solution of the family takes and returns, descriptions aside."""

    def tensor(t: ir.Tensor) -> tuple:
        return (t.name, t.dtype.kind, t.dtype.name, t.shape, t.optional)

    return (tuple(map(tensor, fam.inputs)), tuple(map(tensor, fam.outputs)))


def _template(fam: ir.Family) -> str | None:
    """The family's name template with its fields left blank, or None.

    Without a `name` statement names start with the family's own name, which no other
    family has, so only explicit templates can spell another family's names.
    """
    if fam.name_template is None:
        return None
    try:
        parsed = list(string.Formatter().parse(fam.name_template))
    except ValueError:
        return None
    return "".join(text + ("{}" if field else "") for text, field, _, _ in parsed)


def _requirements(fam: ir.Family) -> dict[str, ir.Require]:
    """The family's `require` rules by their syntax tree (positions and spacing aside)."""
    out: dict[str, ir.Require] = {}
    for r in fam.rules:
        if isinstance(r, ir.Require):
            tree = rules.parse(r.expr.text)
            out.setdefault(ast.dump(tree) if tree is not None else r.expr.text, r)
    return out


# What a rule may read of a call: its arguments, the plan's, the wrapper, names let from them.
_CALL_REFS = frozenset({"run", "plan", "self", "let"})


def _reads_the_call(fam: ir.Family, rule: ir.Require) -> bool:
    scope = rules.scope(fam, frozenset())
    return any(r.kind in _CALL_REFS for r in rules.refs(rule.expr.text, scope))


def _is_size(node: ast.expr) -> bool:
    """``x.shape[i]``, ``x.size(i)``, ``x.numel()``, ``x.ndim``, ``x.dim()``, ``len(x)``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
    if isinstance(node, ast.Attribute):
        return node.attr == "ndim"
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute):
            return f.attr in ("size", "numel", "dim")
        return isinstance(f, ast.Name) and f.id == "len"
    return False


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _number(node.operand)
        return None if value is None else -value
    const = node.value if isinstance(node, ast.Constant) else None
    if isinstance(const, (int, float)) and not isinstance(const, bool):
        return const
    return None


def _holds_for_every_size(rule: ir.Require) -> bool:
    """A comparison of a size with a bound no size can fail: ``q.shape[0] >= 0``."""
    tree = rules.parse(rule.expr.text)
    if not isinstance(tree, ast.Compare) or len(tree.ops) != 1:
        return False
    left, op, right = tree.left, tree.ops[0], tree.comparators[0]
    if _is_size(right) and not _is_size(left):  # 0 <= q.shape[0]
        flipped = {ast.LtE: ast.GtE, ast.Lt: ast.Gt, ast.NotEq: ast.NotEq}
        if type(op) not in flipped:
            return False
        left, op, right = right, flipped[type(op)](), left
    bound = _number(right)
    if not _is_size(left) or bound is None:
        return False
    return (
        (isinstance(op, ast.GtE) and bound <= 0)
        or (isinstance(op, ast.Gt) and bound < 0)
        or (isinstance(op, ast.NotEq) and bound < 0)
    )


def _sets_nothing_apart(fam: ir.Family, rule: ir.Require) -> str | None:
    """Why a rule has the same value for every call; None when it may tell calls apart."""
    if not _reads_the_call(fam, rule):
        return "mentions no argument of the call"
    if _holds_for_every_size(rule):
        return "holds for every call (no size is negative)"
    return None


def chains(module_families: list[ir.Family], groups: list[ir.DispatchGroup]) -> list[list[str]]:
    """Families that one API offers a call to in turn, in order."""
    grouped = {name for g in groups for case in g.cases for name in case.families}
    by_api: dict[str, list[str]] = {}
    for fam in module_families:
        if fam.api is not None and fam.name not in grouped:
            by_api.setdefault(fam.api.path, []).append(fam.name)
    out = [c for c in by_api.values() if len(c) > 1]
    out += [list(case.families) for g in groups for case in g.cases if len(case.families) > 1]
    return out


def check_variants(
    families: dict[str, ir.Family], groups: list[ir.DispatchGroup], report: Report
) -> None:
    """Report families of one API that nothing tells apart."""
    for chain in chains(list(families.values()), groups):
        members = [families[n] for n in chain if n in families]
        for i, earlier in enumerate(members):
            for later in members[i + 1 :]:
                if _contract(earlier) == _contract(later):
                    continue
                template = _template(earlier)
                if template is None or template != _template(later):
                    continue
                path = earlier.api.path if earlier.api else "its API"
                later_rules = _requirements(later)
                own = [r for k, r in _requirements(earlier).items() if k not in later_rules]
                why = [_sets_nothing_apart(earlier, r) for r in own]
                if not all(why):
                    continue
                if own:
                    report(
                        f"rule `{' '.join(own[0].expr.text.split())}` of family "
                        f"`{earlier.name}` {why[0]}, so it cannot keep "
                        f"`{earlier.name}` from calls of `{path}` meant for `{later.name}`",
                        own[0].span,
                        f"the rule has the same value for every call; write the condition "
                        f"that `{earlier.name}`'s calls meet over the arguments of `{path}` or "
                        "its plan, such as `page_size == 1`",
                    )
                    continue
                report(
                    f"families `{earlier.name}` and `{later.name}` both stand for `{path}` and "
                    "spell their names alike, but take different inputs or outputs; nothing "
                    f"keeps `{earlier.name}` from calls meant for `{later.name}`",
                    earlier.span,
                    f"give `{earlier.name}` a rule that its calls meet and `{later.name}`'s do "
                    "not: a condition on the arguments, such as `page_size == 1`",
                )
