"""What a family's rules mean: names in rule expressions, when each rule is checked, and
which API parameters the family accounts for (Note [rules] in ``fibgen/compiler/ir.py``).

The checker reports from this; the dispatch generator spells the checks from it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal

from fibgen.compiler import ir
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python

# Functions a rule may call besides torch and math: fibgen/runtime/routing/rulefns.py defines them.
#
# Note [data rules in capture]: a rule that reads tensor values on the host (`.all()`,
# `.item()`) synchronizes, which CUDA-graph capture forbids (the capture breaks). Such rules
# are written `not capturing() and <check>`: inside capture they fail without reading, and
# the call falls back to the original API, counted by the rule.
RULE_HELPERS = ("kv_pair", "nvfp4_4over6_off", "capturing")
# Names a rule expression may use besides the family's own (see checks.EXPR_BUILTINS).
RULE_GLOBALS = frozenset({"torch", "math", "None", "True", "False", *RULE_HELPERS})

RefKind = Literal["run", "plan", "self", "axis", "param", "let", "global", "unknown"]
Stage = Literal["plan", "const", "call"]


@dataclass(frozen=True)
class Ref:
    """A name used by a rule expression: what it means and where it stands in the text."""

    kind: RefKind
    name: str  # "plan.x" for a plan parameter
    line: int  # 1-based line within the expression text
    column: int  # 0-based column within that line
    width: int


@dataclass(frozen=True)
class Scope:
    """What names mean in one family's rule expressions."""

    run: dict[str, ir.ApiParam]  # API parameters, and keywords its `**` parameter carries
    plan: dict[str, ir.ApiParam]  # plan parameters, likewise
    lets: frozenset[str]  # names introduced by `let` ("plan.x" for plan-time ones)
    # The parameters ("x", "plan.x", "self") each of those names is computed from, in order
    # of appearance, through the lets it reads (Note [rule names]).
    let_reads: dict[str, tuple[str, ...]]
    # How each rule of the family (by id) is reported when it fails (Note [rule names]).
    named: dict[int, str]
    axes: dict[str, ir.VarAxis | ir.ConstAxis]
    params: dict[str, ir.Param]
    method: bool  # the API is a method: `self` is the wrapper
    builtins: frozenset[str]


def keywords_of(fam: ir.Family) -> dict[str, ir.Keywords]:
    """The `keywords` rules by target ("kwargs" or "plan.kwargs")."""
    return {r.target: r for r in fam.rules if isinstance(r, ir.Keywords)}


def scope(fam: ir.Family, builtins: frozenset[str]) -> Scope:
    """The names of one family's rule expressions."""
    keywords = keywords_of(fam)
    run: dict[str, ir.ApiParam] = {}
    plan: dict[str, ir.ApiParam] = {}
    for sig, table, prefix in ((fam.api, run, ""), (fam.plan, plan, "plan.")):
        if sig is None:
            continue
        for p in sig.params:
            table.setdefault(p.name, p)
            if p.kind == "var_keyword" and prefix + p.name in keywords:
                for k in keywords[prefix + p.name].params:
                    table.setdefault(k.name, k)
    existing = set(run) | {f"plan.{n}" for n in plan}
    lets = frozenset(
        r.target
        for r in fam.rules
        if isinstance(r, (ir.Let, ir.Default)) and r.target not in existing
    )
    method = bool(fam.api and fam.api.params and fam.api.params[0].name == "self")
    sc = Scope(
        run=run,
        plan=plan,
        lets=lets,
        let_reads={},
        named={},
        axes={a.name: a for a in fam.axes},
        params={p.name: p for p in fam.params},
        method=method,
        builtins=builtins | RULE_GLOBALS,
    )
    _name_rules(fam, sc)
    return sc


def _name_rules(fam: ir.Family, sc: Scope) -> None:
    """Fill ``sc.let_reads`` and ``sc.named`` (Note [rule names])."""

    def reads(text: str) -> tuple[str, ...]:
        names: list[str] = []
        for r in refs(text, sc):
            if r.kind in ("run", "plan", "self"):
                names.append(r.name)
            elif r.kind == "let":
                names += sc.let_reads.get(r.name, ())
        return tuple(dict.fromkeys(names))

    # Plan-time lets first: call-time lets may read them wherever they stand.
    new = [r for r in fam.rules if isinstance(r, ir.Let) and r.target in sc.lets]
    for let in sorted(new, key=lambda r: not r.target.startswith("plan.")):
        sc.let_reads[let.target] = reads(let.expr.text)
    for rule in fam.rules:
        if isinstance(rule, ir.Require):
            sc.named[id(rule)] = ",".join(reads(rule.expr.text)) or rule.expr.text
        elif isinstance(rule, (ir.Let, ir.Default, ir.Result, ir.Keywords)):
            sc.named[id(rule)] = rule.target
        else:
            sc.named[id(rule)] = ",".join(rule.names)


def parse(text: str) -> ast.expr | None:
    """The expression of a rule, or None when it does not parse (lowering reported it)."""
    try:
        return parse_python(text, "eval").body
    except PythonSyntaxError:
        return None


def refs(text: str, sc: Scope) -> list[Ref]:
    """Every name the expression uses, in order of appearance."""
    tree = parse(text)
    if tree is None:
        return []
    found: list[Ref] = []
    plan_attrs: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "plan"
        ):
            plan_attrs.add(id(node.value))
            name = f"plan.{node.attr}"
            if node.attr in sc.plan:
                kind: RefKind = "plan"
            elif name in sc.lets:
                kind = "let"
            else:
                kind = "unknown"
            found.append(_ref(kind, name, node))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or id(node) in plan_attrs:
            continue
        found.append(_ref(_kind(node.id, sc), node.id, node))
    # Comprehension variables are local to the expression.
    bound = {
        n.id
        for comp in ast.walk(tree)
        if isinstance(comp, ast.comprehension)
        for n in ast.walk(comp.target)
        if isinstance(n, ast.Name)
    }
    bound |= {a.arg for lam in ast.walk(tree) if isinstance(lam, ast.Lambda) for a in lam.args.args}
    found = [r for r in found if not (r.kind == "unknown" and r.name in bound)]
    return sorted(found, key=lambda r: (r.line, r.column))


def _ref(kind: RefKind, name: str, node: ast.expr) -> Ref:
    end = getattr(node, "end_col_offset", None)
    start = node.col_offset
    width = (end - start) if end is not None and node.end_lineno == node.lineno else len(name)
    return Ref(kind, name, node.lineno, start, max(1, width))


def _kind(name: str, sc: Scope) -> RefKind:
    if name in sc.run:
        return "run"
    if name in sc.lets:
        return "let"
    if name == "self" and sc.method:
        return "self"
    if name in sc.axes:
        return "axis"
    if name in sc.params:
        return "param"
    if name in sc.builtins:
        return "global"
    return "unknown"


def stage(used: list[Ref], sc: Scope) -> Stage:
    """When a rule can be checked: at plan, once per definition, or on every call.

    A rule that calls a helper of the runtime reads more than the definition's values (the
    environment, for ``nvfp4_4over6_off()``): it is checked on every call.
    """
    kinds = {r.kind for r in used}
    if any(r.name in RULE_HELPERS for r in used) and not kinds & {"plan", "self"}:
        return "call"
    plan_lets = {r.name for r in used if r.kind == "let" and r.name.startswith("plan.")}
    run_lets = {r.name for r in used if r.kind == "let" and not r.name.startswith("plan.")}
    if not kinds - {"plan", "self", "global", "let"} and not run_lets:
        return "plan" if ("plan" in kinds or plan_lets or "self" in kinds) else "const"
    if not kinds - {"axis", "param", "global"}:
        if all(r.kind != "axis" or isinstance(sc.axes[r.name], ir.ConstAxis) for r in used):
            return "const"
    return "call"


# Note [rule names]: a failed rule is reported (the fallback reason, counted in stats) by the
# API parameters it reads, so that the reason names what the caller passed. A rule that reads
# a `let` reads the parameters the let is computed from (through the lets it reads in turn):
# `let bias_given = routing_bias is not None` then `bias_given or (n_group or 0) > 1` is
# named `routing_bias,n_group` (a let that raises is named by its own name: the value it
# could not compute). A let or `default` that gives a parameter a new value is still that
# parameter (`let x = x.contiguous()`; also `let seg_indptr = seg_indptr if seg_indptr is
# not None else cumsum(seg_lens)`: naming what the new value reads as well would name the
# shapes and devices many such lets read). A rule that reads no parameter is named by its
# text.
def rule_name(rule: ir.Rule, sc: Scope) -> str:
    """How a failed rule is reported: the parameters it reads, or its text (Note [rule
    names])."""
    return sc.named[id(rule)]


# ---------------------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unaccounted:
    """A parameter that nothing in the family accounts for."""

    name: str  # "plan.x" for a plan parameter
    param: ir.ApiParam
    signature: str  # the path of the api/plan line, or of the keywords rule


def _output_targets(fam: ir.Family) -> set[str]:
    return {t.target for t in fam.outputs if t.target is not None}


def accounted(fam: ir.Family, sc: Scope, selectors: frozenset[str]) -> set[str]:
    """Every parameter name ("x", "plan.x") that the family accounts for."""
    done: set[str] = set()
    if sc.method:
        done |= {"self", "plan.self"}
    for t in fam.inputs:
        src = t.source
        if src is None:
            if t.name in sc.run:
                done.add(t.name)
            elif t.name in sc.plan:
                done.add(f"plan.{t.name}")
        else:
            done.add(("plan." if src.from_plan else "") + src.param)
    targets = _output_targets(fam)
    done |= targets
    done |= {f"return_{t}" for t in targets}
    done |= {e.target for e in fam.effects}
    done |= selectors
    names_like_definition = set(sc.axes) | set(sc.params)
    done |= {n for n in sc.run if n in names_like_definition}
    done |= {f"plan.{n}" for n in sc.plan if n in names_like_definition}
    for rule in fam.rules:
        if isinstance(rule, ir.Require):
            done |= {r.name for r in refs(rule.expr.text, sc) if r.kind in ("run", "plan")}
        elif isinstance(rule, ir.Ignore):
            done |= set(rule.names)
        elif isinstance(rule, ir.Result):
            continue
        else:
            done.add(rule.target)
            if not isinstance(rule, ir.Keywords):
                done |= {r.name for r in refs(rule.expr.text, sc) if r.kind in ("run", "plan")}
    return done


def unaccounted(fam: ir.Family, sc: Scope, selectors: frozenset[str]) -> list[Unaccounted]:
    """Parameters of the api/plan lines (and declared keywords) nothing accounts for."""
    done = accounted(fam, sc, selectors)
    keywords = keywords_of(fam)
    out: list[Unaccounted] = []
    for sig, prefix in ((fam.api, ""), (fam.plan, "plan.")):
        if sig is None:
            continue
        for p in sig.params:
            if prefix + p.name not in done:
                out.append(Unaccounted(prefix + p.name, p, sig.path))
            rule = keywords.get(prefix + p.name)
            if p.kind == "var_keyword" and rule is not None:
                for k in rule.params:
                    if prefix + k.name not in done:
                        out.append(Unaccounted(prefix + k.name, k, rule.path))
    return out


def definition_named(fam: ir.Family, sc: Scope) -> list[str]:
    """API parameters named like an axis or parameter of the family ("x" or "plan.x").

    A call's value must agree with the definition's; the dispatcher checks it unless the
    parameter is what the call's key is read from.
    """
    like = set(sc.axes) | set(sc.params)
    out = [n for n in sc.run if n in like]
    out += [f"plan.{n}" for n in sc.plan if n in like]
    return out
