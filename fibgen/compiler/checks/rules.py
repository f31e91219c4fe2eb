"""Checks of a family's rules and of the accounting of its API parameters (Note [rules])."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Iterable

from fibgen.compiler import ir, rules
from fibgen.compiler.pysyntax import PythonSyntaxError, literal_value
from fibgen.compiler.rules import Scope

Report = Callable[[str, ir.Span | None, str | None], None]


def _closest(name: str, candidates: Iterable[str]) -> str | None:
    match = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return match[0] if match else None


def _help(name: str, candidates: Iterable[str], kind: str) -> str:
    candidates = sorted(set(candidates))
    close = _closest(name, candidates)
    if close:
        return f"did you mean `{close}`?"
    if candidates:
        shown = ", ".join(f"`{c}`" for c in candidates[:12])
        more = f" and {len(candidates) - 12} more" if len(candidates) > 12 else ""
        return f"{kind}: {shown}{more}"
    return f"no {kind}"


def _at(span: ir.Span, line: int, column: int, width: int) -> ir.Span:
    """The span of a piece of an expression: ``line`` 1-based within it, ``column`` 0-based."""
    if line == 1:
        col, lineno = span.column + column, span.line
    else:
        col, lineno = column + 1, span.line + line - 1
    return ir.Span(file=span.file, line=lineno, column=col, end_line=lineno, end_column=col + width)


def _names(sc: Scope) -> list[str]:
    return (
        list(sc.run)
        + [f"plan.{n}" for n in sc.plan]
        + [n for n in sc.lets]
        + list(sc.axes)
        + list(sc.params)
        + (["self"] if sc.method else [])
    )


class RuleChecker:
    """Reports the problems of one family's rules and its unaccounted parameters."""

    def __init__(self, fam: ir.Family, builtins: frozenset[str], report: Report) -> None:
        self.fam = fam
        self.sc = rules.scope(fam, builtins)
        self.report = report

    def err(self, message: str, span: ir.Span | None, help: str | None = None) -> None:
        self.report(message, span, help)

    def run(self, selectors: frozenset[str]) -> None:
        fam = self.fam
        if fam.rules and fam.api is None:
            self.err(
                "`rules` need an `api`: they hold its calls to the definition",
                fam.rules[0].span,
                "declare the API first: `api pkg.mod.func(...)`",
            )
            return
        keyword_targets: dict[str, ir.Keywords] = {}
        for rule in fam.rules:
            if isinstance(rule, ir.Require):
                self._expression(rule.expr, "rule")
                self._types(rule.expr)
            elif isinstance(rule, ir.Ignore):
                self._ignore(rule)
            elif isinstance(rule, ir.Default):
                self._default(rule)
            elif isinstance(rule, ir.Result):
                self._result(rule)
            elif isinstance(rule, ir.Let):
                self._expression(rule.expr, "`let`")
                self._let_stage(rule)
            else:
                if rule.target in keyword_targets:
                    self.err(
                        f"`keywords {rule.target}` is given twice",
                        rule.target_span,
                        f"the first is at {keyword_targets[rule.target].span}",
                    )
                keyword_targets[rule.target] = rule
                self._keywords(rule)
        if fam.api is None:
            return
        for miss in rules.unaccounted(fam, self.sc, selectors):
            shown = miss.name
            self.err(
                f"parameter `{shown}` of `{miss.signature}` is accounted for by nothing",
                miss.param.span,
                f"read it with an input (`<- {shown}`), require a value in `rules` "
                f'(`{shown} == ...`), or `ignore {shown} "why"` if it cannot change the '
                "results",
            )

    # ------------------------------------------------------------------ pieces
    def _expression(self, expr: ir.Expr, what: str) -> None:
        for ref in rules.refs(expr.text, self.sc):
            if ref.kind != "unknown":
                continue
            span = _at(expr.span, ref.line, ref.column, ref.width)
            if ref.name.startswith("plan."):
                if self.fam.plan is None:
                    self.err(
                        f"`{ref.name}` in a {what}, but the family declares no `plan`",
                        span,
                        "add `plan pkg.Wrapper.plan(self, ...)`",
                    )
                else:
                    attr = ref.name[5:]
                    self.err(
                        f"`{attr}` is not a parameter of `{self.fam.plan.path}`",
                        span,
                        _help(attr, self.sc.plan, "its parameters"),
                    )
                continue
            self.err(
                f"unknown name `{ref.name}` in a {what}",
                span,
                _help(ref.name, _names(self.sc), "names a rule can use"),
            )

    def _param(self, name: str) -> ir.ApiParam | None:
        if name.startswith("plan."):
            return self.sc.plan.get(name[5:])
        return self.sc.run.get(name)

    def _known_params(self) -> list[str]:
        return list(self.sc.run) + [f"plan.{n}" for n in self.sc.plan]

    def _ignore(self, rule: ir.Ignore) -> None:
        read = {
            ("plan." if t.source.from_plan else "") + t.source.param: t.name
            for t in self.fam.inputs
            if t.source is not None
        }
        read |= {t.name: t.name for t in self.fam.inputs if t.source is None}
        for name, span in zip(rule.names, rule.name_spans or (rule.span,) * len(rule.names)):
            if self._param(name) is None:
                self.err(
                    f"`ignore {name}`: no parameter `{name}`",
                    span,
                    _help(name, self._known_params(), "parameters"),
                )
            elif name in read:
                self.err(
                    f"`{name}` is read by input `{read[name]}`; it cannot be ignored",
                    span,
                    "remove it from `ignore`",
                )

    def _default(self, rule: ir.Default) -> None:
        param = self._param(rule.target)
        if param is None:
            self.err(
                f"`default {rule.target}`: no parameter `{rule.target}`",
                rule.target_span,
                _help(rule.target, self._known_params(), "parameters"),
            )
        elif param.default not in (None, "None"):
            # A parameter without a default may still be passed a None (FlashInfer's MoEs take
            # `routing_bias` so); one whose default is a value never gets a None from it.
            self.err(
                f"`default {rule.target}` stands for a None, but `{rule.target}` has default "
                f"`{param.default}`",
                rule.target_span,
                "`default` resolves a parameter whose API default is None, or that has none; "
                "use `let` to replace a value, or require one",
            )
        self._expression(rule.expr, "`default`")
        self._let_stage(rule)

    def _let_stage(self, rule: ir.Let | ir.Default) -> None:
        """Lets run before the call is routed: no definition values; plan ones at plan."""
        plan_time = rule.target.startswith("plan.")
        for ref in rules.refs(rule.expr.text, self.sc):
            if ref.kind in ("axis", "param"):
                self.err(
                    f"`{rule.kind} {rule.target}` reads `{ref.name}` of the definition",
                    _at(rule.expr.span, ref.line, ref.column, ref.width),
                    f"`{rule.kind}` is computed before the call is routed, from the API's "
                    "arguments alone",
                )
            elif plan_time and ref.kind == "run":
                self.err(
                    f"`{rule.kind} {rule.target}` is computed at plan time but reads `{ref.name}`"
                    " of the run call",
                    _at(rule.expr.span, ref.line, ref.column, ref.width),
                    "a plan-time value may read only `plan.` parameters and `self`",
                )

    def _result(self, rule: ir.Result) -> None:
        outputs = {t.name for t in self.fam.outputs}
        if rule.target not in outputs:
            self.err(
                f"`result {rule.target}`: no output `{rule.target}`",
                rule.target_span,
                _help(rule.target, outputs, "outputs"),
            )
        inputs = {t.name for t in self.fam.inputs}
        for ref in rules.refs(rule.expr.text, self.sc):
            if ref.kind == "unknown" and (ref.name in outputs or ref.name in inputs):
                continue
            if ref.kind == "unknown":
                self.err(
                    f"unknown name `{ref.name}` in `result`",
                    _at(rule.expr.span, ref.line, ref.column, ref.width),
                    _help(ref.name, sorted(outputs | inputs), "outputs and inputs"),
                )

    def _keywords(self, rule: ir.Keywords) -> None:
        prefix, _, name = rule.target.rpartition(".")
        sig = self.fam.plan if prefix == "plan" else self.fam.api
        star = None if sig is None else next((p for p in sig.params if p.name == name), None)
        if sig is None or star is None or star.kind != "var_keyword":
            self.err(
                f"`keywords {rule.target}`: `{rule.target}` is not a `**` parameter",
                rule.target_span,
                "name the `**kwargs` parameter of the api or plan line",
            )
            return
        named = {p.name for p in sig.params}
        for p in rule.params:
            if p.kind == "var_positional" or p.kind == "var_keyword":
                self.err("`keywords` lists named keywords only", p.span, None)
            elif p.default is None:
                self.err(
                    f"keyword `{p.name}` has no default",
                    p.span,
                    f"write it as `{p.name}=DEFAULT`, the default of `{rule.path}`",
                )
            elif p.name in named:
                self.err(
                    f"keyword `{p.name}` is also a named parameter of `{sig.path}`",
                    p.span,
                    None,
                )

    def _types(self, expr: ir.Expr) -> None:
        """A parameter compared with a constant of another type than its default's."""
        tree = rules.parse(expr.text)
        if tree is None:
            return
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare) or len(node.ops) != 1:
                continue
            name = _param_name(node.left)
            if name is None:
                continue
            param = self._param(name)
            if param is None or param.default is None:
                continue
            expected = _literal_type(param.default)
            if expected is None:
                continue
            right = node.comparators[0]
            if isinstance(node.ops[0], (ast.In, ast.NotIn)) and isinstance(
                right, (ast.Tuple, ast.List, ast.Set)
            ):
                values = right.elts
            elif isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
                values = [right]
            else:
                continue
            for v in values:
                got = _literal_type_of_node(v)
                if got is None or got == "NoneType" or _compatible(expected, got):
                    continue
                self.err(
                    f"`{name}` is compared with a {got}, but its default `{param.default}` is "
                    f"a {expected}",
                    _at(
                        expr.span,
                        v.lineno,
                        v.col_offset,
                        max(1, (v.end_col_offset or 0) - v.col_offset),
                    ),
                    f"compare `{name}` with a {expected}",
                )


def _param_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "plan":
            return f"plan.{node.attr}"
    return None


def _literal_type(text: str) -> str | None:
    try:
        value = literal_value(text)
    except PythonSyntaxError:
        return None
    return None if value is None else type(value).__name__


def _literal_type_of_node(node: ast.expr) -> str | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return type(value).__name__


def _compatible(expected: str, got: str) -> bool:
    numbers = {"int", "float", "bool"}
    return expected == got or (expected in numbers and got in numbers)
