"""Semantic checks and instantiation: families → concrete definitions.

Every check reports with its own message and the span of the thing to edit. Checks never stop
at the first problem: a family with errors still yields as many diagnostics as can be found,
and no definitions.
"""

from __future__ import annotations

import ast
import difflib
import keyword
import math
import operator
import re
from dataclasses import dataclass
from typing import Iterable

from fibgen.compiler import ir, rules
from fibgen.compiler.check_rules import RuleChecker
from fibgen.compiler.diagnostics import Diagnostic, error, warning
from fibgen.compiler.variants import check_variants
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python
from fibgen.format.models import NAME_RULE, name_problem

# Names a constraint or hint expression may use besides axes, params and tensors.
EXPR_BUILTINS = frozenset(
    {"len", "int", "float", "min", "max", "abs", "sum", "all", "any", "round", "math", "bool"}
    | {n for n in dir(math) if not n.startswith("_")}
)

_TEMPLATE_FIELD = re.compile(r"\{([^{}]*)\}")
_REQUIRES = re.compile(r"^sm_?(\d{2,3})a?$")


def _closest(name: str, candidates: Iterable[str]) -> str | None:
    match = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return match[0] if match else None


def _did_you_mean(name: str, candidates: Iterable[str], kind: str) -> str:
    # Sets have no stable order across runs; messages must be byte-identical.
    candidates = (
        list(candidates) if not isinstance(candidates, (set, frozenset)) else sorted(candidates)
    )
    close = _closest(name, candidates)
    if close:
        return f"did you mean `{close}`?"
    if candidates:
        return f"declared {kind}: {', '.join(candidates)}"
    return f"no {kind} are declared"


def _shown(text: str) -> str:
    """Text from the source as a message shows it: on one line, control characters escaped."""
    return text if text.isprintable() else repr(text)[1:-1]


def _names_in(text: str) -> list[tuple[str, int]]:
    """Free names in an expression with their column offsets (attribute names excluded)."""
    try:
        tree = parse_python(text, "eval")
    except PythonSyntaxError:
        return []
    return [(n.id, n.col_offset) for n in ast.walk(tree) if isinstance(n, ast.Name)]


def _sub_span(span: ir.Span, offset: int, width: int) -> ir.Span:
    col = span.column + offset
    return ir.Span(
        file=span.file, line=span.line, column=col, end_line=span.line, end_column=col + width
    )


def _hint_signatures() -> dict | None:
    try:
        from fibgen.format.hints import HINT_SIGNATURES
    except ImportError:  # the hint table is optional for the compiler
        return None
    return HINT_SIGNATURES


@dataclass
class _FamilyView:
    """Derived lookups for one family, computed once."""

    family: ir.Family
    axes: dict[str, ir.VarAxis | ir.ConstAxis]
    params: dict[str, ir.Param]
    dtype_params: dict[str, ir.DtypeParam]
    inputs: dict[str, ir.Tensor]
    outputs: dict[str, ir.Tensor]


class Checker:
    """Runs every check over a set of source files and builds the definitions."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    def err(self, message: str, span: ir.Span | None, help: str | None = None) -> None:
        self.diagnostics.append(error(message, span, help))

    def warn(self, message: str, span: ir.Span | None, help: str | None = None) -> None:
        self.diagnostics.append(warning(message, span, help))

    # ------------------------------------------------------------------ entry point
    def run(self, files: list[ir.SourceFile]) -> list[ir.Definition]:
        """Check all files together; return the definitions of the families without errors."""
        definitions: list[ir.Definition] = []
        families: dict[str, ir.Family] = {}
        # The selector of a dispatch group is a parameter its families account for.
        self.selectors: dict[str, frozenset[str]] = {}
        for sf in files:
            for group in sf.dispatches:
                for case in group.cases:
                    for name in case.families:
                        known = self.selectors.get(name, frozenset())
                        self.selectors[name] = known | {group.selector}
        for sf in files:
            for fam in sf.families:
                if fam.name in families:
                    self.err(
                        f"family `{fam.name}` is defined twice",
                        fam.span,
                        help=f"the first definition is at {families[fam.name].span}",
                    )
                    continue
                families[fam.name] = fam
                definitions.extend(self.family(fam, sf.path))
        self._check_unique_names(definitions, families)
        self._same_returns(families)
        dispatch_names: dict[str, ir.DispatchGroup] = {}
        for sf in files:
            for group in sf.dispatches:
                if group.name in dispatch_names:
                    self.err(
                        f"dispatch group `{group.name}` is defined twice",
                        group.span,
                        help=f"the first is at {dispatch_names[group.name].span}",
                    )
                dispatch_names[group.name] = group
                self.dispatch(group, families)
        check_variants(families, list(dispatch_names.values()), self.err)
        return definitions

    def _check_unique_names(
        self, defs: list[ir.Definition], families: dict[str, ir.Family]
    ) -> None:
        seen: dict[str, ir.Definition] = {}
        for d in defs:
            if d.name in seen:
                first = seen[d.name]
                self.err(
                    f"definition name `{d.name}` is generated twice",
                    d.span,
                    help=f"also generated by family `{first.family}` at {first.span}; "
                    "change an instance value or the family's name template",
                )
            else:
                seen[d.name] = d

    # ------------------------------------------------------------------ families
    def family(self, fam: ir.Family, path: str) -> list[ir.Definition]:
        before = len([d for d in self.diagnostics if d.severity == "error"])
        view = self._declarations(fam)
        self._tensors(view)
        self._var_axes_bound(view)
        self._constraints(view)
        self._api(view)
        RuleChecker(fam, EXPR_BUILTINS, self.err).run(self.selectors.get(fam.name, frozenset()))
        self._effects(view)
        self._returns(view)
        self._reference(view)
        self._name_template(view)
        self._requires(fam)
        errors_so_far = len([d for d in self.diagnostics if d.severity == "error"])
        # With errors in the declarations, instances are still checked but not built.
        defs = self._instances(view, path, build=errors_so_far == before)
        after = len([d for d in self.diagnostics if d.severity == "error"])
        return defs if after == before else []

    def _declarations(self, fam: ir.Family) -> _FamilyView:
        axes: dict[str, ir.VarAxis | ir.ConstAxis] = {}
        for ax in fam.axes:
            if ax.name in axes:
                self.err(
                    f"axis `{ax.name}` is declared twice",
                    ax.span,
                    help=f"the first is at {axes[ax.name].span}",
                )
            else:
                axes[ax.name] = ax
        abbrevs: dict[str, ir.Node] = {}
        for ax in fam.axes:
            if isinstance(ax, ir.ConstAxis) and ax.abbrev:
                if ax.abbrev in abbrevs and abbrevs[ax.abbrev] is not ax:
                    self.err(
                        f"abbreviation `{ax.abbrev}` is used by two consts",
                        ax.span,
                        help="each name part needs its own abbreviation",
                    )
                abbrevs[ax.abbrev] = ax
        params: dict[str, ir.Param] = {}
        for p in fam.params:
            if p.name in params or p.name in axes:
                self.err(
                    f"parameter `{p.name}` clashes with another declaration",
                    p.span,
                    help="parameters, axes and tensors need distinct names",
                )
            params[p.name] = p
        dtype_params: dict[str, ir.DtypeParam] = {}
        for dp in fam.dtype_params:
            if dp.name in dtype_params:
                self.err(f"dtype parameter `{dp.name}` is declared twice", dp.span)
            dtype_params[dp.name] = dp
            for choice in dp.choices:
                if choice not in ir.DTYPES:
                    self.err(
                        f"unknown dtype `{choice}` in `dtype {dp.name}`",
                        dp.span,
                        help=f"allowed dtypes: {', '.join(ir.DTYPES)}",
                    )
        inputs: dict[str, ir.Tensor] = {}
        for t in fam.inputs:
            if t.name in inputs:
                self.err(
                    f"input `{t.name}` is declared twice",
                    t.span,
                    help=f"the first is at {inputs[t.name].span}",
                )
            inputs[t.name] = t
        outputs: dict[str, ir.Tensor] = {}
        for t in fam.outputs:
            if t.name in outputs:
                self.err(
                    f"output `{t.name}` is declared twice",
                    t.span,
                    help=f"the first is at {outputs[t.name].span}",
                )
            elif t.name in inputs:
                self.err(
                    f"`{t.name}` is both an input and an output",
                    t.span,
                    help="give the output its own name; an in-place kernel writes back "
                    f"with `-> {inputs[t.name].source.param if inputs[t.name].source else t.name}`",
                )
            outputs[t.name] = t
        for name in list(inputs) + list(outputs):
            if name in axes:
                self.err(
                    f"tensor `{name}` has the name of an axis",
                    (inputs.get(name) or outputs[name]).span,
                    help="constraints refer to both by name, so they must differ",
                )
        # These names become parameters and variables of generated Python.
        named = [("an axis", a) for a in fam.axes] + [("a parameter", p) for p in fam.params]
        named += [("an input", t) for t in fam.inputs] + [("an output", t) for t in fam.outputs]
        for what, node in named:
            if keyword.iskeyword(node.name):
                self.err(
                    f"`{node.name}` is a Python keyword and cannot name {what}",
                    node.span,
                    help="generated Python uses this name as a variable: choose another",
                )
        return _FamilyView(fam, axes, params, dtype_params, inputs, outputs)

    def _tensors(self, v: _FamilyView) -> None:
        for t in v.family.inputs + v.family.outputs:
            is_output = t.name in v.outputs and v.outputs[t.name] is t
            self._dtype(v, t)
            for i, dim in enumerate(t.shape or ()):
                if dim not in v.axes:
                    self.err(
                        f"unknown axis `{dim}` in the shape of `{t.name}`",
                        t.dim_spans[i] if i < len(t.dim_spans) else t.span,
                        help=_did_you_mean(dim, v.axes, "axes"),
                    )
            if is_output:
                if t.gen is not None:
                    self.err(
                        f"output `{t.name}` has a generation hint",
                        t.gen.span,
                        help="only inputs are generated",
                    )
            elif t.target is not None:
                self.err(
                    f"input `{t.name}` has a write-back target `-> {t.target}`",
                    t.span,
                    help="`->` belongs to outputs; an input is read with `<-`",
                )
            if t.gen is not None:
                self._hint(v, t)

    def _dtype(self, v: _FamilyView, t: ir.Tensor) -> None:
        ref = t.dtype
        if ref.kind == "from":
            if ref.name not in v.inputs:
                self.err(
                    f"`dtype({ref.name})` names no input",
                    ref.span,
                    help=_did_you_mean(ref.name, v.inputs, "inputs"),
                )
            elif v.inputs[ref.name].dtype.kind == "from":
                self.err(
                    f"`dtype({ref.name})` refers to an input whose dtype is itself copied",
                    ref.span,
                    help="copy from an input with a declared dtype",
                )
        elif ref.name not in ir.DTYPES and ref.name not in v.dtype_params:
            close = _closest(ref.name, list(ir.DTYPES) + list(v.dtype_params))
            self.err(
                f"unknown dtype `{ref.name}` for `{t.name}`",
                ref.span,
                help=(f"did you mean `{close}`? " if close else "")
                + f"allowed dtypes: {', '.join(ir.DTYPES)}",
            )

    def _hint(self, v: _FamilyView, t: ir.Tensor) -> None:
        hint = t.gen
        assert hint is not None
        known = self._expr_names(v)
        for expr in list(hint.args) + [e for _, e in hint.kwargs]:
            for name, offset in _names_in(expr.text):
                if name not in known:
                    self.err(
                        f"unknown name `{name}` in the generation hint of `{t.name}`",
                        _sub_span(expr.span, offset, len(name)),
                        help=_did_you_mean(name, known - EXPR_BUILTINS, "names"),
                    )
        table = _hint_signatures()
        if table is None:
            return
        sig = table.get(hint.kind)
        if sig is None:
            self.err(
                f"unknown generation hint `{hint.kind}`",
                hint.span,
                help=_did_you_mean(hint.kind, sorted(table), "hints"),
            )
            return
        positional = tuple(getattr(sig, "positional", ()))
        keywords = tuple(getattr(sig, "keywords", ()))
        required = tuple(getattr(sig, "required", ()))
        if len(hint.args) > len(positional):
            self.err(
                f"`{hint.kind}` takes at most {len(positional)} positional argument"
                f"{'s' if len(positional) != 1 else ''}",
                hint.span,
                help=f"signature: {hint.kind}({', '.join(positional + keywords)})",
            )
        given = set(positional[: len(hint.args)]) | {k for k, _ in hint.kwargs}
        for key, _ in hint.kwargs:
            if key not in positional and key not in keywords:
                self.err(
                    f"`{hint.kind}` has no argument `{key}`",
                    hint.span,
                    help=f"signature: {hint.kind}({', '.join(positional + keywords)})",
                )
        for key in required:
            if key not in given:
                self.err(
                    f"`{hint.kind}` needs the argument `{key}`",
                    hint.span,
                    help=f"signature: {hint.kind}({', '.join(positional + keywords)})",
                )

    def _expr_names(self, v: _FamilyView) -> set[str]:
        return set(v.axes) | set(v.params) | set(v.inputs) | set(v.outputs) | EXPR_BUILTINS

    def _var_axes_bound(self, v: _FamilyView) -> None:
        bound = {d for t in v.family.inputs for d in (t.shape or ())}
        for ax in v.family.axes:
            if isinstance(ax, ir.VarAxis) and ax.name not in bound:
                self.err(
                    f"var axis `{ax.name}` is bound by no input shape",
                    ax.span,
                    help="a var axis takes its value from an input's shape at run time; "
                    "use it in an input's shape, or make it `const`",
                )

    def _constraints(self, v: _FamilyView) -> None:
        known = self._expr_names(v)
        for c in v.family.constraints:
            for name, offset in _names_in(c.text):
                if name not in known:
                    self.err(
                        f"unknown name `{name}` in constraint",
                        _sub_span(c.span, offset, len(name)),
                        help=_did_you_mean(name, known - EXPR_BUILTINS, "names"),
                    )

    def _api(self, v: _FamilyView) -> None:
        fam = v.family
        # Parameters, the keywords a `**` parameter carries, and names made by `let`.
        sc = rules.scope(fam, EXPR_BUILTINS)
        api = set(sc.run) | {n for n in sc.lets if "." not in n} if fam.api else None
        plan = (
            set(sc.plan) | {n[5:] for n in sc.lets if n.startswith("plan.")} if fam.plan else None
        )
        for sig in (fam.api, fam.plan):
            if sig is None:
                continue
            seen: set[str] = set()
            for p in sig.params:
                if p.name in seen:
                    self.err(f"parameter `{p.name}` appears twice in `{sig.path}`", p.span)
                seen.add(p.name)
        if fam.plan is not None and fam.api is None:
            self.err("`plan` needs an `api` (the run method of the same wrapper)", fam.plan.span)
        if fam.api is not None and fam.no_api is not None:
            self.err(
                f"family `{fam.name}` has both an `api` and `api none`",
                fam.api.span,
                help="keep one: the API the family stands for, or why it has none",
            )
        for t in fam.inputs:
            src = t.source
            if src is None:
                if api is not None and t.name not in api and not (plan and t.name in plan):
                    self.err(
                        f"input `{t.name}` is not a parameter of `{fam.api.path}`",
                        t.span,
                        help="read it from a parameter with `<- PARAM`, "
                        f"one of: {', '.join(sorted(api))}",
                    )
                continue
            if src.from_plan:
                if plan is None:
                    self.err(
                        f"`<- plan.{src.param}` but the family declares no `plan`",
                        src.span,
                        help="add `plan pkg.Wrapper.plan(self, ...)`",
                    )
                elif src.param not in plan:
                    self.err(
                        f"`plan.{src.param}` is not a parameter of `{fam.plan.path}`",
                        src.span,
                        help=_did_you_mean(src.param, plan, "parameters"),
                    )
            elif api is None:
                self.err(
                    f"`<- {src.param}` but the family declares no `api`",
                    src.span,
                    help="declare the API it reads from: `api pkg.mod.func(...)`",
                )
            elif src.param not in api:
                self.err(
                    f"`{src.param}` is not a parameter of `{fam.api.path}`",
                    src.span,
                    help=_did_you_mean(src.param, api, "parameters"),
                )
        self._tuple_reads(fam)
        for t in fam.outputs:
            if t.target is None:
                continue
            # An API parameter, or an input: the tensor that input reads (an element of a
            # tuple parameter, say) is written in place.
            targets = (api or set()) | set(v.inputs)
            if t.target not in targets:
                where = f"a parameter of `{fam.api.path}` or an input" if api else "an input"
                self.err(
                    f"write-back target `{t.target}` of `{t.name}` is not {where}",
                    t.span,
                    help=_did_you_mean(t.target, targets, "names"),
                )

    def _effects(self, v: _FamilyView) -> None:
        fam = v.family
        # The API parameters outputs are written into, also through an input that reads one.
        reads = {t.name: t.source.param if t.source else t.name for t in fam.inputs}
        written = {reads.get(t.target, t.target) for t in fam.outputs if t.target is not None}
        seen: dict[str, ir.Effect] = {}
        for e in fam.effects:
            if fam.api is None:
                self.err(
                    "`effect` needs an `api`: it says what a routed call of it also writes",
                    e.span,
                    help="declare the API first: `api pkg.mod.func(...)`",
                )
                continue
            params = fam.api.param_names()
            if e.target not in params:
                self.err(
                    f"effect target `{e.target}` is not a parameter of `{fam.api.path}`",
                    e.target_span,
                    help=_did_you_mean(e.target, params, "parameters"),
                )
            elif e.target in written:
                self.err(
                    f"`{e.target}` is already written back by an output",
                    e.target_span,
                    help="an output's write-back and an effect cannot share a target",
                )
            elif e.target in seen:
                self.err(
                    f"two effects write `{e.target}`",
                    e.target_span,
                    help=f"the first is at {seen[e.target].span}",
                )
            seen.setdefault(e.target, e)
            known = set(v.inputs) | {"torch"}
            for name, offset in _names_in(e.expr.text):
                if name not in known:
                    self.err(
                        f"unknown name `{name}` in effect",
                        _sub_span(e.expr.span, offset, len(name)),
                        help="an effect is computed from the definition's inputs (and `torch`); "
                        + _did_you_mean(name, v.inputs, "inputs"),
                    )

    def _returns(self, v: _FamilyView) -> None:
        """`returns` names outputs, each once, that the API returns (Note [returns])."""
        fam = v.family
        r = fam.returns
        if r is None:
            return
        if fam.api is None:
            self.err(
                "`returns` says what the API returns, but the family declares no `api`",
                r.span,
                help="a family without an API is called with its inputs and returns its "
                "outputs in order; remove `returns`",
            )
            return
        named: dict[str, ir.Span] = {}
        for name, span in zip(r.names, r.name_spans or (r.span,) * len(r.names)):
            if name in named:
                self.err(
                    f"output `{name}` is named twice in `returns`",
                    span,
                    help=f"the first is at {named[name]}",
                )
                continue
            named[name] = span
            out = v.outputs.get(name)
            if out is None:
                writer = next((o for o in fam.outputs if o.target == name), None)
                self.err(
                    f"`returns` names no output `{name}`",
                    span,
                    help=(
                        f"`{name}` is written by output `{writer.name}`: name the output"
                        if writer is not None
                        else _did_you_mean(name, v.outputs, "outputs")
                    ),
                )
            elif _flag_of(fam, out) is not None:
                self.err(
                    f"output `{name}` is returned when `{_flag_of(fam, out)}` asks for it",
                    span,
                    help="leave it out of `returns`: an output a flag asks for follows the "
                    "others when the call asks for it, as FlashInfer returns it",
                )
        for out in fam.outputs:
            if out.target is None and out.name not in named:
                # Nothing would hold it: the routed call would compute it for nobody.
                self.err(
                    f"output `{out.name}` is neither returned nor written into an argument",
                    r.span,
                    help=f"name `{out.name}` in `returns`, or write it into a buffer of the "
                    "API with `-> PARAM`",
                )
        for rule in fam.rules:
            if not isinstance(rule, ir.Result) or rule.target not in v.outputs:
                continue
            out = v.outputs[rule.target]
            if _flag_of(fam, out) is not None:
                continue
            if rule.target not in named:
                self.err(
                    f"`result {rule.target}` says how `{rule.target}` is returned, but "
                    "`returns` leaves it out",
                    rule.target_span,
                    help=f"name `{rule.target}` in `returns` at {r.span}, or remove the rule",
                )
            elif _written_input(fam, out) is not None:
                self.err(
                    f"`result {rule.target}` cannot change what is returned for "
                    f"`{rule.target}`",
                    rule.target_span,
                    help=f"`{rule.target}` is written into input "
                    f"`{_written_input(fam, out).name}`, and `returns` gives the caller's own "
                    "tensor, as the API does; remove the rule",
                )

    def _same_returns(self, families: dict[str, ir.Family]) -> None:
        """Families of one API return alike: a call's result cannot depend on which routes it."""
        by_api: dict[str, list[ir.Family]] = {}
        for fam in families.values():
            if fam.api is not None:
                by_api.setdefault(fam.api.path, []).append(fam)
        for path, fams in by_api.items():
            first = next((f for f in fams if f.returns is not None), None)
            if first is None:
                continue
            want = _count_values(len(first.returns.names))
            for fam in fams:
                if fam is first:
                    continue
                if fam.returns is None:
                    self.err(
                        f"family `{fam.name}` has no `returns`, but `{first.name}`, which stands "
                        "for the same API, has one",
                        fam.api.span,
                        help=f"a call of `{path}` returns alike whichever family routes it: give "
                        f"`{fam.name}` a `returns` of {want} too (that of `{first.name}` is at "
                        f"{first.returns.span})",
                    )
                elif len(fam.returns.names) != len(first.returns.names):
                    got = _count_values(len(fam.returns.names))
                    self.err(
                        f"family `{fam.name}` returns {got}, but `{first.name}`, which stands "
                        f"for the same API, returns {want}",
                        fam.returns.span,
                        help=f"a call of `{path}` returns alike whichever family routes it "
                        f"(that of `{first.name}` is at {first.returns.span})",
                    )

    def _tuple_reads(self, fam: ir.Family) -> None:
        # An API parameter is read whole or element by element, and each element by one input.
        whole: dict[tuple[bool, str], ir.Tensor] = {}
        parts: dict[tuple[bool, str, int], ir.Tensor] = {}
        api = set(fam.api.param_names()) if fam.api else set()
        for t in fam.inputs:
            src = t.source
            if src is None and t.name in api:
                # An input without `<-` reads the API parameter of its own name.
                src = ir.Source(param=t.name, span=t.span)
            if src is None:
                continue
            key = (src.from_plan, src.param)
            shown = ("plan." if src.from_plan else "") + src.param
            if src.index is None:
                if key in whole:
                    self.err(
                        f"`{shown}` is read by both `{whole[key].name}` and `{t.name}`",
                        src.span,
                        help="each API parameter feeds one input",
                    )
                whole[key] = t
            else:
                pkey = key + (src.index,)
                if pkey in parts:
                    self.err(
                        f"`{shown}[{src.index}]` is read by both `{parts[pkey].name}` and "
                        f"`{t.name}`",
                        src.span,
                        help="each tuple element feeds one input",
                    )
                parts[pkey] = t
        for t in fam.inputs:
            src = t.source
            if src is not None and src.index is not None and (src.from_plan, src.param) in whole:
                other = whole[(src.from_plan, src.param)]
                self.err(
                    f"`{src.param}` is read whole by `{other.name}` and as a tuple by "
                    f"`{t.name}`",
                    src.span,
                    help=f"read every element with an index, e.g. `<- {src.param}[0]`",
                )
        # Tuple elements are numbered from 0 without gaps: a gap means an index points nowhere.
        by_param: dict[tuple[bool, str], list[int]] = {}
        for plan, param, index in parts:
            by_param.setdefault((plan, param), []).append(index)
        for (plan, param), indices in by_param.items():
            expected = list(range(len(indices)))
            if sorted(indices) != expected:
                # The first gap; counted up from 0, as an index may be far too large to span.
                missing = next(i for i in range(len(indices) + 1) if i not in indices)
                t = parts[(plan, param, max(indices))]
                self.err(
                    f"`{param}[{max(indices)}]` points past the elements read from `{param}`",
                    t.source.span if t.source else t.span,
                    help=f"no input reads `{param}[{missing}]`; tuple elements are "
                    "numbered from 0",
                )

    def _reference(self, v: _FamilyView) -> None:
        fam = v.family
        if fam.reference is not None:
            self._reference_text(v, fam.reference, fam.reference_span)
        for inst in fam.instances:
            if inst.reference is not None:
                self._reference_text(v, inst.reference, inst.reference_span)

    def _reference_text(self, v: _FamilyView, text: str, span: ir.Span) -> None:
        try:
            module = parse_python(text)
        except PythonSyntaxError as exc:
            if exc.lineno is None:  # nested too deeply: Python's parser does not say where
                self.err(f"the reference is not valid Python: {exc.msg}", span)
                return
            line = span.line + exc.lineno
            at = ir.Span(file=span.file, line=line, column=1, end_line=line, end_column=2)
            self.err(
                f"the reference is not valid Python: {exc.msg}",
                at,
                help=f"line {exc.lineno} of the reference body",
            )
            return
        run = next(
            (n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "run"), None
        )
        if run is None:
            self.err(
                "the reference has no top-level `def run(...)`",
                span,
                help=f"define `def run({', '.join(v.inputs)})`",
            )
            return
        params = [a.arg for a in run.args.posonlyargs + run.args.args]
        inputs = list(v.inputs)
        if set(params) != set(inputs) or len(params) != len(inputs):
            missing = [n for n in inputs if n not in params]
            extra = [n for n in params if n not in inputs]
            detail = []
            if missing:
                detail.append(f"missing {', '.join(missing)}")
            if extra:
                detail.append(f"unknown {', '.join(extra)}")
            self.err(
                f"the parameters of `run` are not the inputs ({'; '.join(detail)})",
                span,
                help=f"write `def run({', '.join(inputs)})`",
            )
        elif params != inputs:
            self.warn(
                "the parameters of `run` are the inputs in another order",
                span,
                help=f"callers pass inputs positionally in declaration order: "
                f"write `def run({', '.join(inputs)})`",
            )

    def _name_template(self, v: _FamilyView) -> None:
        fam = v.family
        if fam.name_template is None:
            return
        span = fam.name_template_span if fam.name_template_span.line > 0 else fam.span
        allowed = set(v.axes) | set(v.params) | set(v.dtype_params)
        for m in _TEMPLATE_FIELD.finditer(fam.name_template):
            key = m.group(1)
            if key not in allowed:
                self.err(
                    f"name template field `{{{_shown(key)}}}` is not an axis or parameter",
                    span,
                    help=_did_you_mean(key, allowed, "names"),
                )
            elif key in v.axes and isinstance(v.axes[key], ir.VarAxis):
                self.err(
                    f"name template field `{{{key}}}` is a var axis",
                    span,
                    help="a definition name can only use const values",
                )
        # The text around the fields is in every name: check it once, here.
        problem = name_problem(_TEMPLATE_FIELD.sub("0", fam.name_template))
        if problem is not None:
            self.err(
                f"name template `{_shown(fam.name_template)}` gives unsafe definition names: "
                f"the text {problem}",
                span,
                help=NAME_RULE,
            )

    def _requires(self, fam: ir.Family) -> None:
        for req in fam.requires:
            if not _REQUIRES.match(req):
                self.err(
                    f"unknown requirement `{req}`",
                    fam.span,
                    help="write a minimum compute capability such as `sm90` or `sm100`",
                )

    # ------------------------------------------------------------------ instances
    def _instances(self, v: _FamilyView, path: str, build: bool) -> list[ir.Definition]:
        fam = v.family
        instances = fam.instances or (ir.Instance(values=(), span=fam.span),)
        key_of: dict[str, str] = {}
        for ax in fam.axes:
            if isinstance(ax, ir.ConstAxis):
                key_of[ax.name] = ax.name
                if ax.abbrev:
                    key_of.setdefault(ax.abbrev, ax.name)
        for p in fam.params:
            key_of[p.name] = p.name
            if p.abbrev:
                key_of.setdefault(p.abbrev, p.name)
        for dp in fam.dtype_params:
            key_of[dp.name] = dp.name
        defs: list[ir.Definition] = []
        for index, inst in enumerate(instances):
            values: dict[str, ir.Assignment] = {}
            ok = True
            for a in inst.values:
                target = key_of.get(a.key)
                if target is None:
                    ok = False
                    self.err(
                        f"`{a.key}` is not a const axis, parameter or dtype parameter of "
                        f"`{fam.name}`",
                        a.span,
                        help=_did_you_mean(a.key, key_of, "keys"),
                    )
                    continue
                if target in values:
                    ok = False
                    self.err(f"`{target}` is given twice in this instance", a.span)
                    continue
                ax = v.axes.get(target)
                if isinstance(ax, ir.ConstAxis) and ax.value is not None:
                    ok = False
                    self.err(
                        f"`{target}` is pinned to `{ax.value.text}` and cannot be set per "
                        "instance",
                        a.span,
                        help="remove it from the instance",
                    )
                    continue
                values[target] = a
            if not ok:
                continue
            for choice in self._dtype_choices(v, values, inst):
                d = self._definition(v, inst, index, values, choice, path, build)
                if d is not None:
                    defs.append(d)
        return defs

    def _dtype_choices(
        self, v: _FamilyView, values: dict[str, ir.Assignment], inst: ir.Instance
    ) -> list[dict[str, str]]:
        combos: list[dict[str, str]] = [{}]
        for dp in v.family.dtype_params:
            if dp.name in values:
                value = values[dp.name].value
                if value not in dp.choices:
                    self.err(
                        f"`{dp.name} = {value}` is not one of {', '.join(dp.choices)}",
                        values[dp.name].span,
                    )
                    return []
                options = [str(value)]
            else:
                options = list(dp.choices)
            combos = [dict(c, **{dp.name: o}) for c in combos for o in options]
        return combos

    def _definition(
        self,
        v: _FamilyView,
        inst: ir.Instance,
        index: int,
        values: dict[str, ir.Assignment],
        dtypes: dict[str, str],
        path: str,
        build: bool,
    ) -> ir.Definition | None:
        fam = v.family
        params: dict[str, int | float | str | bool] = {}
        ok = True
        for p in fam.params:
            if p.name in values:
                params[p.name] = values[p.name].value
            elif p.default is not None:
                params[p.name] = p.default
            else:
                ok = False
                self.err(
                    f"parameter `{p.name}` has no value in this instance",
                    inst.span,
                    help=f"add `{p.name} = VALUE`, or give the parameter a default",
                )
        consts = self._const_values(v, inst, values, params)
        if consts is None or not ok or not build:
            return None
        name = self._name(v, consts, params, dtypes)
        problem = name_problem(name)
        if problem is not None:
            # From a value: the name template (or the family name) was checked on its own.
            self.err(f"definition name `{_shown(name)}` {problem}", inst.span, help=NAME_RULE)
            return None

        def dtype_of(t: ir.Tensor) -> str:
            ref = t.dtype
            if ref.kind == "from":
                return dtype_of(v.inputs[ref.name])
            return dtypes.get(ref.name, ref.name)

        def def_tensor(t: ir.Tensor) -> ir.DefTensor:
            return ir.DefTensor(
                name=t.name,
                dtype=dtype_of(t),
                shape=t.shape,
                optional=t.optional,
                description=t.description,
                span=t.span,
            )

        reference = inst.reference if inst.reference is not None else fam.reference
        if reference is not None and params:
            prelude = "".join(f"{k} = {params[k]!r}\n" for k in params)
            reference = prelude + reference
        return ir.Definition(
            name=name,
            op_type=fam.op_type,
            description=inst.description if inst.description is not None else fam.description,
            tags=fam.tags + inst.tags,
            axes=tuple(
                ir.DefAxis(
                    name=ax.name,
                    kind=ax.kind,
                    value=consts.get(ax.name) if ax.kind == "const" else None,
                    description=ax.description,
                    span=ax.span,
                )
                for ax in fam.axes
            ),
            constraints=tuple(c.text for c in fam.constraints),
            inputs=tuple(def_tensor(t) for t in fam.inputs),
            outputs=tuple(def_tensor(t) for t in fam.outputs),
            reference=reference,
            family=fam.name,
            source_file=path,
            instance_index=index,
            consts=tuple((ax.name, consts[ax.name]) for ax in fam.axes if ax.kind == "const"),
            param_values=tuple(params.items()),
            dtype_values=tuple(dtypes.items()),
            span=inst.span,
        )

    def _const_values(
        self, v: _FamilyView, inst: ir.Instance, values: dict[str, ir.Assignment], params: dict
    ) -> dict[str, int] | None:
        consts: dict[str, int] = {}
        pending: list[ir.ConstAxis] = []
        ok = True
        for ax in v.family.axes:
            if not isinstance(ax, ir.ConstAxis):
                continue
            if ax.value is not None:
                pending.append(ax)
            elif ax.name in values:
                value = values[ax.name].value
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    ok = False
                    self.err(
                        f"const `{ax.name}` must be a non-negative integer, got `{value}`",
                        values[ax.name].span,
                    )
                elif value > INT64_MAX:
                    ok = False
                    self.err(
                        f"const `{ax.name}` = {value} does not fit in 64 bits",
                        values[ax.name].span,
                        help=f"a size is at most {INT64_MAX}",
                    )
                else:
                    consts[ax.name] = value
            else:
                ok = False
                key = ax.abbrev or ax.name
                self.err(
                    f"const axis `{ax.name}` has no value in this instance",
                    inst.span,
                    help=f"add `{key} = VALUE`, or pin it with `{ax.name} : const = VALUE`",
                )
        # Derived consts may refer to each other in any order: evaluate until nothing changes.
        while pending and ok:
            progressed = False
            for ax in list(pending):
                assert ax.value is not None
                names = {n for n, _ in _names_in(ax.value.text)} - EXPR_BUILTINS
                unknown = names - set(consts) - set(params) - {p.name for p in pending}
                if unknown:
                    bad = sorted(unknown)[0]
                    self.err(
                        f"`{bad}` in the value of `{ax.name}` is not a const or parameter",
                        ax.value.span,
                    )
                    return None
                if names & {p.name for p in pending}:
                    continue
                value = _evaluate(ax.value.text, {**params, **consts})
                if value is _UNPARSABLE:
                    return None  # lowering reported the syntax error in this expression
                if isinstance(value, str):  # `<why>`: the expression has no value
                    self.err(
                        f"`{ax.name} = {ax.value.text}` has no value: {value[1:-1]}",
                        ax.value.span,
                    )
                    return None
                if (isinstance(value, float) and not value.is_integer()) or value < 0:
                    self.err(
                        f"`{ax.name} = {ax.value.text}` gives {value!r}, not a "
                        "non-negative integer",
                        ax.value.span,
                        help="use `//` for integer division" if isinstance(value, float) else None,
                    )
                    return None
                if value > INT64_MAX:
                    self.err(
                        f"`{ax.name} = {ax.value.text}` gives {int(value)}, which does not fit "
                        "in 64 bits",
                        ax.value.span,
                        help=f"a size is at most {INT64_MAX}",
                    )
                    return None
                consts[ax.name] = int(value)
                pending.remove(ax)
                progressed = True
            if not progressed:
                self.err(
                    f"the values of {', '.join(a.name for a in pending)} depend on each " "other",
                    pending[0].span,
                )
                return None
        return consts if ok else None

    def _name(
        self, v: _FamilyView, consts: dict[str, int], params: dict, dtypes: dict[str, str]
    ) -> str:
        fam = v.family
        if fam.name_template is not None:
            fields = {
                **{k: str(x) for k, x in params.items()},
                **{k: str(x) for k, x in consts.items()},
                **{k: ir.DTYPE_NAME_PART[x] for k, x in dtypes.items()},
            }
            return _TEMPLATE_FIELD.sub(
                lambda m: fields.get(m.group(1), m.group(0)), fam.name_template
            )
        return definition_name(fam, consts, params, dtypes)

    # ------------------------------------------------------------------ dispatch groups
    def dispatch(self, group: ir.DispatchGroup, families: dict[str, ir.Family]) -> None:
        if not group.cases:
            self.err(
                f"dispatch `{group.name}` has no cases",
                group.span,
                help="add a line `VALUE -> FAMILY` for each family the selector picks",
            )
        apis: set[str] = set()
        seen_values: dict[object, ir.DispatchCase] = {}
        for case in group.cases:
            if case.value in seen_values:
                self.err(
                    f"selector value `{case.value}` appears twice",
                    case.span,
                    help=f"the first is at {seen_values[case.value].span}",
                )
            seen_values[case.value] = case
            for name in case.families:
                fam = families.get(name)
                if fam is None:
                    self.err(
                        f"unknown family `{name}` in dispatch `{group.name}`",
                        case.span,
                        help=_did_you_mean(name, families, "families"),
                    )
                    continue
                if fam.api is None:
                    self.err(f"family `{fam.name}` declares no `api` to dispatch on", case.span)
                    continue
                apis.add(fam.api.path)
                if group.selector not in fam.api.param_names():
                    self.err(
                        f"selector `{group.selector}` is not a parameter of `{fam.api.path}`",
                        group.span,
                        help=_did_you_mean(group.selector, fam.api.param_names(), "parameters"),
                    )
        if len(apis) > 1:
            self.err(
                f"the families of dispatch `{group.name}` declare different APIs",
                group.span,
                help=f"found: {', '.join(sorted(apis))}",
            )


def _written_input(fam: ir.Family, out: ir.Tensor) -> ir.Tensor | None:
    """The input an output is written into in place, or None (a buffer of the caller, or
    none): the reading of a write-back target the dispatcher makes."""
    if fam.api is None or out.target is None:
        return None
    inputs = {t.name: t for t in fam.inputs}
    if out.target in fam.api.param_names():
        written = next(
            (
                t
                for t in fam.inputs
                if t.source is not None and not t.source.from_plan and t.source.param == out.target
            ),
            inputs.get(out.target),
        )
        whole = written is not None and (written.source is None or written.source.index is None)
        return written if whole else None
    return inputs.get(out.target)


def _flag_of(fam: ir.Family, out: ir.Tensor) -> str | None:
    """The API's ``return_<buffer>`` flag that asks for an output, or None."""
    if fam.api is None or out.target is None or _written_input(fam, out) is not None:
        return None
    flag = f"return_{out.target}"
    return flag if flag in fam.api.param_names() else None


def _count_values(n: int) -> str:
    return "None" if n == 0 else "1 value" if n == 1 else f"{n} values"


def definition_name(
    fam: ir.Family, consts: dict[str, int], params: dict, dtypes: dict[str, str]
) -> str:
    """The name rule: family, then named params, named consts (declaration order), dtype parts."""
    parts = [fam.name]
    parts += [f"{p.abbrev}{params[p.name]}" for p in fam.params if p.abbrev]
    parts += [
        f"{ax.abbrev}{consts[ax.name]}"
        for ax in fam.axes
        if isinstance(ax, ir.ConstAxis) and ax.abbrev
    ]
    parts += [ir.DTYPE_NAME_PART[dtypes[dp.name]] for dp in fam.dtype_params]
    return "_".join(parts)


# Note [const arithmetic]: a derived const is computed at compile time from values the
# .fidef gives, by a small interpreter rather than by eval: arithmetic on numbers whose
# magnitude stays below _BOUND, and the functions below, each cheap on such numbers. So no
# expression can make the compiler compute for long or run out of memory (`9**9**9`,
# `factorial(10**9)`); a value out of range is a diagnostic.
INT64_MAX = 2**63 - 1
_BOUND = 2**64
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {
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


class _Unparsable:
    """What `_evaluate` gives for text that is not an expression (lowering reported it)."""


_UNPARSABLE = _Unparsable()


class _ConstError(Exception):
    pass


def _evaluate(text: str, names: dict) -> object:
    """Evaluate a const expression over already-known values (Note [const arithmetic]).

    Returns the value, `_UNPARSABLE`, or a `<reason>` string for an expression that has no
    value.
    """
    try:
        tree = parse_python(text, "eval")
    except PythonSyntaxError:
        return _UNPARSABLE
    assert isinstance(tree, ast.Expression)
    try:
        return _eval_node(tree.body, names)
    except _ConstError as exc:
        return f"<{exc}>"
    except RecursionError:
        return "<the expression is nested too deeply>"
    except (ArithmeticError, ValueError, TypeError) as exc:
        return f"<{type(exc).__name__}: {exc}>"


def _eval_node(node: ast.expr, names: dict) -> object:
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


def _bounded(value: object) -> object:
    if type(value) is bool or not isinstance(value, (int, float)):
        raise _ConstError(f"{value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise _ConstError(f"the value is {value}")
    if abs(value) > _BOUND:
        raise _ConstError("the value is too large for a size")
    return value
