"""How a dispatcher holds a call to its definition: the family's rules spelled as Python.

See Note [rules] in ``fibgen/compiler/ir.py`` for the language and Note [the dispatch
contract] in ``fibgen/runtime/routing/apply.py`` for where the checks run. Every check has an index
into the module's ``_RULES`` table, which names it for stats and messages:

* plan-stage rules run in ``_capture``, the hook the runtime calls after each ``plan()``;
  the first one that fails is kept with the captured arguments (``_plan[-1]``);
* const-stage rules (over the key's fields and the definition's parameters) run once per
  key in ``_const_check``, when the runtime resolves the key;
* call-stage rules, and the dtype and rank of every input tensor, run on each routed call.

Note [output buffers]
~~~~~~~~~~~~~~~~~~~~~
An API that writes into a buffer its caller gives (``out=``, ``lse=``) hands that buffer to a
destination-passing solution, and copies a value-returning solution's result into it. A
buffer of another dtype, rank, size or device than the definition's output for the call is a
call the definition does not describe: a solution would write it as if it were the output
(bf16 bits into a float32 buffer, rows past its end), and ``copy_`` would convert or
broadcast silently. So a given buffer is checked as a value-returning solution's result is
(``_same``: dtype, shape, the inputs' device), under the rule ``tensor:<output>``, after the
input tensors and the call's other rules (which name the real reason where a call is not the
definition's at all); a call it fails goes to the original API, which does with the buffer what it
does. Hand-written ``apply`` checks the same (Note [hand-written inputs] in
``fibgen/runtime/routing/handwritten.py``). A buffer left out costs the hit path one
``is None``. Under torch.compile the op's dispatcher checks it, eagerly. The sizes are those
of the key, of the inputs, and of const axes given by expressions over them
(``total_dim = nope_dim + rope_dim``, ``FamilyPlan.dims(derived=True)``); an axis nothing of
the call gives (a var axis only outputs carry) is left to the rank. Buffers are not checked
for contiguity, as inputs are not: a solution reads the strides it is given. A one-byte float
output given as a ``uint8`` buffer (FlashInfer's fp4 ``y_fp4`` may be) is refused, not viewed:
FlashInfer's own function serves it.

A `result` rule says what the API returns for an output. Where it returns the output inside
a list or tuple (FlashInfer's MoEs return ``[output]``), the caller's buffer holds the output
as the definition does: it is checked as above, handed to the solution, written back, and the
list holds it. Any other `result` lays the output out as the API does (MiniMax-H3's swizzled
scales, fp4 values as uint8 bytes), and that is what the caller's buffer holds: not a rule's
to refuse, and not the solution's to write. A destination-passing solution writes a buffer of
the definition's, which the `result` rule lays out into the caller's; where the call gives no
shape to allocate it, ``cannot_allocate`` fails the solution and the call falls back, counted
as its error (a value-returning solution is served). Under torch.compile such a family runs
its dispatcher eagerly.
"""

from __future__ import annotations

import ast
import builtins
import io
import math
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fibgen.codegen.python.pyliteral import literal, string
from fibgen.compiler import ir, rules
from fibgen.compiler.checks import EXPR_BUILTINS
from fibgen.compiler.rules import RULE_HELPERS


@dataclass
class Spelled:
    """One check: its index in ``_RULES`` and the Python condition that must hold."""

    index: int
    condition: str


@dataclass
class RulePlan:
    """The checks of one family, sorted by stage, with the names ``_RULES`` lists."""

    names: list[str] = field(default_factory=list)
    # Plan stage: statements that extract keywords and apply lets, then the checks.
    capture_lets: list[str] = field(default_factory=list)
    capture_checks: list[Spelled] = field(default_factory=list)
    captured: list[tuple[str, str]] = field(default_factory=list)  # (plan name, expression)
    const_checks: list[Spelled] = field(default_factory=list)
    # Call stage: keyword extraction and lets before the key, checks after routing.
    call_lets: list[tuple[int, str]] = field(default_factory=list)  # (rule index, statement)
    call_checks: list[Spelled] = field(default_factory=list)
    values: list[str] = field(default_factory=list)  # params the checks read per definition
    helpers: set[str] = field(default_factory=set)
    buffers: set[int] = field(default_factory=set)  # indices of output buffers' checks
    run_spelling: dict[str, str] = field(default_factory=dict)  # run name -> variable

    def add(self, name: str) -> int:
        self.names.append(name)
        return len(self.names) - 1


class _Rename(ast.NodeTransformer):
    """Rewrites the names of a rule expression into the variables of one context."""

    def __init__(self, spell: Callable[[str], str | None]) -> None:
        self.spell = spell

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "plan":
            text = self.spell(f"plan.{node.attr}")
            if text is not None:
                return ast.parse(text, mode="eval").body
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        text = self.spell(node.id)
        if text is None:
            return node
        return ast.parse(text, mode="eval").body


def _rename(text: str, spell: Callable[[str], str | None]) -> str:
    tree = _Rename(spell).visit(ast.parse(text, mode="eval"))
    return unparse(tree)


def unparse(tree: ast.AST) -> str:
    """``ast.unparse``, as black writes it: string literals in black's quotes, and where
    ast.unparse spells otherwise (a slice's colon, a float's exponent, ``**``) black's own
    spelling (``x[: n.shape[0]]``, ``3.4e38``)."""
    text = _quoted(ast.unparse(tree))
    if any(_black_respells(node) for node in ast.walk(tree)):
        from fibgen.codegen.python.pyformat import format_one_line

        text = format_one_line(text)
    return text


def _black_respells(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Slice)
        or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow))
        or (isinstance(node, ast.Constant) and isinstance(node.value, (float, complex)))
    )


def _quoted(text: str) -> str:
    if "'" not in text:
        return text
    # ast.unparse writes one line: string tokens are replaced by their column offsets.
    out, last = [], 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.string[:1] in "'\"":
            out += [text[last : tok.start[1]], string(ast.literal_eval(tok.string))]
            last = tok.end[1]
    out.append(text[last:])
    return "".join(out)


def module_names(statements: list[str]) -> set[str]:
    """Names of the math module that spelled rules use: ``math`` itself or bare functions."""
    used: set[str] = set()
    for text in statements:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return {n for n in used if n == "math" or (n in _MATH and n not in _BUILTINS)}


_MATH = frozenset(n for n in dir(math) if not n.startswith("_"))
_BUILTINS = frozenset(dir(builtins))


class RuleSpeller:
    """Builds the RulePlan of one family.

    ``key_fields`` are what the call's key holds (spelled ``_k_<field>``); ``axis_reader``
    spells an axis from the call's tensors (None when no tensor carries it); ``readers`` maps
    key fields to the expression the key reads them with.
    """

    def __init__(
        self,
        family: ir.Family,
        key_fields: tuple[str, ...],
        axis_reader: Callable[[str], str | None],
        key_readers: dict[str, str],
    ) -> None:
        self.f = family
        self.sc = rules.scope(family, EXPR_BUILTINS)
        self.key_fields = key_fields
        self.axis_reader = axis_reader
        self.key_readers = key_readers
        self.plan = RulePlan()
        self.instance = family.api.params[0].name if self.sc.method and family.api else None
        self.plan_instance = (
            family.plan.params[0].name if family.plan is not None and family.plan.params else None
        )
        self._keywords = rules.keywords_of(family)
        self._build()

    # ------------------------------------------------------------------ names
    def plan_slot(self, name: str) -> str:
        """``_plan[i]``: a captured plan value at run time."""
        return f"_plan[{self.captured.index(name)}]"

    def _value_slot(self, param: str) -> str:
        if param not in self.plan.values:
            self.plan.values.append(param)
        return f"_v[{self.plan.values.index(param)}]"

    def _definition_value(self, name: str, stage: str) -> str | None:
        """An axis or parameter of the definition, in the call or const context."""
        if name in self.key_fields:
            return f"_k_{name}"
        if name in self.sc.params:
            return self._value_slot(name)
        if name in self.sc.axes and stage == "call":
            return self.axis_reader(name)
        return None

    def _call_spell(self, name: str) -> str | None:
        if name.startswith("plan."):
            return self.plan_slot(name[5:]) if name[5:] in self.captured else None
        if name in self.plan.run_spelling:
            return self.plan.run_spelling[name]
        if name in self.sc.run or name in self.sc.lets:
            return None if name in self.sc.run else f"_n_{name}"
        if name == "self" and self.instance is not None:
            return self.instance
        if name in self.sc.axes or name in self.sc.params:
            return self._definition_value(name, "call")
        if name in RULE_HELPERS:
            self.plan.helpers.add(name)
        return None

    def _capture_spell(self, name: str) -> str | None:
        if name.startswith("plan."):
            return self._capture_vars.get(name[5:])
        if name == "self" and self.plan_instance is not None:
            return self.plan_instance
        if name in RULE_HELPERS:
            self.plan.helpers.add(name)
        return None

    def _const_spell(self, name: str) -> str | None:
        if name in self.sc.axes or name in self.sc.params:
            return self._definition_value(name, "const")
        return None

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        self.captured = captured_names(self.f)
        self._capture_vars: dict[str, str] = {}
        if self.f.plan is not None:
            for p in self.f.plan.params[1:]:
                if p.kind in ("positional", "keyword_only", "var_positional", "var_keyword"):
                    self._capture_vars[p.name] = p.name
        self._keyword_extraction()
        for rule in self.f.rules:
            if isinstance(rule, (ir.Default, ir.Let)):
                self._let(rule)
        for rule in self.f.rules:
            if isinstance(rule, ir.Require):
                self._require(rule)
        self._definition_named()
        self.plan.captured = [(n, self._capture_vars.get(n, "None")) for n in self.captured]

    def _keyword_extraction(self) -> None:
        for target, rule in self._keywords.items():
            star = target.rpartition(".")[2]
            known = tuple(k.name for k in rule.params)
            index = self.plan.add(target)
            defaults = {k.name: k.default for k in rule.params}
            if target.startswith("plan."):
                for name in known:
                    var = f"_w_{name}"
                    self.plan.capture_lets.append(
                        f"{var} = {star}.get({literal(name)}, {_default(defaults[name])})"
                    )
                    self._capture_vars[name] = var
                self.plan.capture_checks.append(
                    Spelled(index, f"{star}.keys() <= {{{', '.join(map(literal, known))}}}")
                )
            else:
                for name in known:
                    var = f"_w_{name}"
                    self.plan.call_lets.append(
                        (index, f"{var} = {star}.get({literal(name)}, {_default(defaults[name])})")
                    )
                    self.plan.run_spelling[name] = var
                self.plan.call_checks.append(
                    Spelled(index, f"{star}.keys() <= {{{', '.join(map(literal, known))}}}")
                )

    def _let(self, rule: ir.Default | ir.Let) -> None:
        index = self.plan.add(rule.target)
        if rule.target.startswith("plan."):
            name = rule.target[5:]
            value = _rename(rule.expr.text, self._capture_spell)
            var = self._capture_vars.get(name) or f"_n_{name}"
            if isinstance(rule, ir.Default):
                self.plan.capture_lets.append(f"if {var} is None:")
                self.plan.capture_lets.append(f"    {var} = {value}")
            else:
                self.plan.capture_lets.append(f"{var} = {value}")
            self._capture_vars[name] = var
            return
        value = _rename(rule.expr.text, self._call_spell)
        current = self.plan.run_spelling.get(rule.target, rule.target)
        var = f"_l_{rule.target}"
        if isinstance(rule, ir.Default):
            value = f"{value} if {current} is None else {current}"
        self.plan.call_lets.append((index, f"{var} = {value}"))
        self.plan.run_spelling[rule.target] = var

    def _require(self, rule: ir.Require) -> None:
        used = rules.refs(rule.expr.text, self.sc)
        stage = rules.stage(used, self.sc)
        index = self.plan.add(rules.rule_name(rule, self.sc))
        if stage == "plan":
            cond = _rename(rule.expr.text, self._capture_spell)
            self.plan.capture_checks.append(Spelled(index, cond))
            return
        if stage == "const" and all(r.kind != "axis" or r.name in self.key_fields for r in used):
            cond = _rename(rule.expr.text, self._const_spell)
            self.plan.const_checks.append(Spelled(index, cond))
            return
        cond = _rename(rule.expr.text, self._call_spell)
        self.plan.call_checks.append(Spelled(index, cond))

    def _definition_named(self) -> None:
        """An argument named like an axis or parameter must agree with the definition."""
        for name in rules.definition_named(self.f, self.sc):
            bare = name.rpartition(".")[2]
            arg = self._call_spell(name) or name
            if self.key_readers.get(bare) == arg:
                continue  # the key is read from this argument: equal by construction
            value = self._definition_value(bare, "call")
            if value is None:
                continue
            index = self.plan.add(name)
            self.plan.call_checks.append(Spelled(index, f"{arg} == {value}"))

    def tensor_checks(
        self,
        tensors: list[tuple[str, str, bool, str, tuple[str, ...]]],
        buffers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """dtype, rank and sizes of input tensors: (name, expression, optional, dtype, shape);
        then the conditions of the caller's output buffers, (output, condition)
        (Note [output buffers]).

        A size is checked against the key's value of its axis, the value a pinned axis has,
        or the size of the first required input that carries the axis.
        """
        checks = []
        for name, expr, optional, dtype, shape in tensors:
            index = self.plan.add(f"tensor:{name}")
            parts = [f"{expr}.dtype is {dtype}", f"{expr}.ndim == {len(shape)}"]
            for i, axis in enumerate(shape):
                mine = f"{expr}.shape[{i - len(shape)}]"
                expected = self._size_of(axis)
                if self.key_readers.get(axis) == mine:
                    continue  # the key was read from this very size
                if expected is not None and expected != mine:
                    parts.append(f"{mine} == {expected}")
            cond = " and ".join(parts)
            if optional:
                cond = f"{expr} is None or ({cond})"
            checks.append(Spelled(index, cond))
        # Tensors first: later rules may read their shapes.
        self.plan.call_checks[0:0] = checks
        # Buffers last: a call another rule refuses is refused by that rule, not by a buffer
        # whose expected shape assumed the call was the definition's (Note [output buffers]).
        for name, cond in buffers:
            index = self.plan.add(f"tensor:{name}")
            self.plan.buffers.add(index)
            self.plan.call_checks.append(Spelled(index, cond))

    def _size_of(self, axis: str) -> str | None:
        if axis in self.key_fields:
            return f"_k_{axis}"
        declared = self.sc.axes.get(axis)
        if isinstance(declared, ir.ConstAxis) and declared.value is not None:
            names = {r.name for r in rules.refs(declared.value.text, self.sc)}
            if names <= set(self.key_fields) | {"min", "max"}:
                return _rename(declared.value.text, lambda n: f"_k_{n}" if n in names else None)
        return self.axis_reader(axis)


def captured_names(family: ir.Family) -> list[str]:
    """Plan names kept for run time: named parameters, keywords, new `let` names."""
    if family.plan is None:
        return []
    plan = family.plan
    names = [p.name for p in plan.params[1:] if p.kind in ("positional", "keyword_only")]
    keywords = rules.keywords_of(family)
    star = next((p for p in plan.params if p.kind == "var_keyword"), None)
    if star is not None and f"plan.{star.name}" in keywords:
        names += [k.name for k in keywords[f"plan.{star.name}"].params]
    existing = set(names) | {p.name for p in plan.params}
    names += [
        r.target[5:]
        for r in family.rules
        if isinstance(r, (ir.Let, ir.Default))
        and r.target.startswith("plan.")
        and r.target[5:] not in existing
    ]
    return list(dict.fromkeys(names))


def _default(text: str | None) -> str:
    return "None" if text is None else unparse(ast.parse(text, mode="eval"))
