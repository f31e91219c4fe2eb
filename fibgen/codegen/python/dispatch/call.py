"""The API call that stands for a definition's inputs: how a tool calls a dispatcher as an
engine would (Note [api calls] in fibgen/runtime/inputs/api_calls.py).

The dispatcher maps an API call to the definition's inputs (``_inputs``). The recipe is the
other way: for each parameter of the API (and of its ``plan`` for a wrapper), where its value
comes from when all one has is the definition's inputs and output buffers. It is computed
here from the family's `<-`/`->` mappings and its rules, so that nothing at run time parses
a rule; the runtime builds the call and checks it by the dispatcher's own mapping.
"""

from __future__ import annotations

import ast
from typing import Any

from fibgen.codegen.python.dispatch.plan import FamilyPlan
from fibgen.compiler import ir
from fibgen.compiler.rules import keywords_of

# An entry is (parameter, how, argument):
#   ("input", name)                 the definition's input
#   ("inputs", ((index, name), ...)) a tuple of inputs (``paged_kv_cache[0]``, ``[1]``)
#   ("output", name)                the buffer of an output (``-> out``)
#   ("literal", value)              a value the rules require (``eps == 1e-6``, ``x is None``)
#   ("param", name)                 the definition's value of a family parameter (``eps == EPS``)
#   ("axis", name)                  the definition's value of a const axis (``head_dim``)
#   ("torch", dtype)                a torch dtype a rule allows (``x in (None, torch.bfloat16)``)
#   ("empty", None)                 an empty ``*args`` / ``**kwargs``
# Parameters left at their defaults have no entry; ``self`` of a wrapper has none either.


def _constant(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return False, None


def _subject(node: ast.AST, plan_side: bool) -> str | None:
    """The parameter a comparison is about: ``x`` (run) or ``plan.x`` (plan)."""
    if not plan_side and isinstance(node, ast.Name):
        return node.id
    if (
        plan_side
        and isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "plan"
    ):
        return node.attr
    return None


class _Recipe:
    """Works out one side's entries (the run method, or ``plan``) of a family's call."""

    def __init__(self, view: FamilyPlan) -> None:
        self.view = view
        self.f = view.f
        self.params = {p.name for p in self.f.params}
        self.axes = {a.name for a in self.f.axes if isinstance(a, ir.ConstAxis)}
        self.problems: list[str] = []

    def required_values(self, plan_side: bool) -> dict[str, tuple[str, Any]]:
        """What the `require` rules pin a parameter to: (how, argument)."""
        found: dict[str, tuple[str, Any]] = {}
        for r in self.f.rules:
            if not isinstance(r, ir.Require):
                continue
            try:
                tree = ast.parse(r.expr.text, mode="eval").body
            except SyntaxError:
                continue
            if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1):
                continue
            name = _subject(tree.left, plan_side)
            if name is None or name in found:
                continue
            op, right = tree.ops[0], tree.comparators[0]
            ok, value = _constant(right)
            if isinstance(op, (ast.Eq, ast.Is)) and ok:
                found[name] = ("literal", value)
            elif isinstance(op, ast.Eq) and isinstance(right, ast.Name):
                if right.id in self.params:
                    found[name] = ("param", right.id)
                elif right.id in self.axes:
                    found[name] = ("axis", right.id)
            elif isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List)):
                # A value the rule allows; None last, since an API may take None to mean
                # "required" (``q_data_type=None`` of the MLA wrapper's plan).
                candidates = [self._allowed(e) for e in right.elts]
                allowed = [a for a in candidates if a is not None]
                allowed.sort(key=lambda a: a == ("literal", None))
                if allowed:
                    found[name] = allowed[0]
        return found

    @staticmethod
    def _allowed(node: ast.AST) -> tuple[str, Any] | None:
        ok, value = _constant(node)
        if ok:
            return ("literal", value)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
            and node.attr in ir.DTYPES
        ):
            return ("torch", node.attr)
        return None

    def side(self, signature: ir.ApiSignature | None, plan_side: bool) -> list[tuple]:
        if signature is None:
            return []
        prefix = "plan." if plan_side else ""
        params = list(signature.params)
        if self.f.plan is not None and params and params[0].name == "self":
            params = params[1:]  # the wrapper: the instance the call is made on
        required = self.required_values(plan_side)
        keywords = keywords_of(self.f)
        entries: list[tuple] = []
        for p in params:
            if p.kind == "var_positional":
                entries.append((p.name, "empty", None))
                continue
            if p.kind == "var_keyword":
                rule = keywords.get(prefix + p.name)
                # Each keyword the rule lists is a parameter of its own; `**` stays empty.
                for k in rule.params if rule is not None else ():
                    entry = self.entry(k, plan_side, required)
                    if entry is not None:
                        entries.append(entry)
                continue
            entry = self.entry(p, plan_side, required)
            if entry is not None:
                entries.append(entry)
        return entries

    def entry(
        self, p: ir.ApiParam, plan_side: bool, required: dict[str, tuple[str, Any]]
    ) -> tuple | None:
        reads = [
            t
            for t in self.f.inputs
            if (
                t.source is not None
                and t.source.param == p.name
                and t.source.from_plan == plan_side
            )
            or (t.source is None and t.name == p.name)
        ]
        if reads:
            if len(reads) == 1 and (reads[0].source is None or reads[0].source.index is None):
                return (p.name, "input", reads[0].name)
            parts = sorted((t.source.index, t.name) for t in reads if t.source is not None)
            if any(i is None for i, _ in parts):
                self.problems.append(f"{p.name} is read whole and by element")
                return None
            return (p.name, "inputs", tuple(parts))
        if not plan_side:
            for o in self.f.outputs:
                target = self.view.targets[o.name]
                if target is not None and target[0] == "buffer" and target[1] == p.name:
                    return (p.name, "output", o.name)
            flagged = p.name.startswith("return_") and any(
                self.view.targets[o.name] == ("buffer", p.name[7:]) for o in self.f.outputs
            )
            if flagged:
                return (p.name, "literal", True)
        if p.name in required:
            how, value = required[p.name]
            return (p.name, how, value)
        if p.name in self.axes:
            return (p.name, "axis", p.name)
        if p.name in self.params:
            return (p.name, "param", p.name)
        if p.default is None:
            where = "plan's " if plan_side else ""
            self.problems.append(
                f"the {where}parameter {p.name} has no default and no input, output or rule "
                "gives its value"
            )
        return None


def call_recipe(view: FamilyPlan) -> tuple[tuple, tuple | None, str | None]:
    """The run entries, the plan entries (None without a plan) and why the call cannot be
    built from the definition's inputs (None when it can)."""
    recipe = _Recipe(view)
    if view.f.api is None:
        return (), None, "the family stands for no API"
    run = tuple(recipe.side(view.f.api, False))
    plan = tuple(recipe.side(view.f.plan, True)) if view.f.plan is not None else None
    # An input read from a name a `let` makes, not from a parameter, has no way back.
    named = {p.name for p in view.f.api.params}
    if view.f.plan is not None:
        named |= set(view.captured)
    for t in view.f.inputs:
        src = t.source.param if t.source is not None else t.name
        if src not in named and not (t.source is None and t.optional):
            recipe.problems.append(f"input {t.name} is read from {src}, which a rule computes")
    problem = "; ".join(dict.fromkeys(recipe.problems)) or None
    return run, plan, problem
