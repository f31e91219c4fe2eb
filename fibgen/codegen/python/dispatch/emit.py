"""Python dispatch target: one module per family (and per dispatch group) plus the package.

Everything the dispatcher needs at call time is decided at generation time: how each const
value is read from the arguments, the table of known definitions, the name rule, how the
definition's inputs are spelled in terms of the API's parameters and how outputs go back into
the caller's buffers. The generated code follows Note [the dispatch contract] in
``fibgen/runtime/routing/apply.py``.

The target is built in layers, each importing only those above it:

* ``dispatch_rules.py``: the family's rules spelled as checks (the rule plan);
* ``dispatch_plan.py``: what the dispatcher reads and writes, decided on the IR;
* ``dispatch_key.py``: what a call is routed by: the key's fields, the name rule;
* ``dispatch_functions.py``: the dispatcher and its hooks, printed from the plan;
* ``dispatch_ops.py``: the custom op that torch.compile traces instead;
* this module: the text of each family's, dispatch group's and the package's module.

Note [effects]
Some APIs write more than their definition exposes: FlashInfer's ``fused_add_rmsnorm`` leaves
``input + residual`` in ``residual`` and the normalized rows in ``input``, while the
definition (and so every solution) produces only the normalized rows. A family says so with
``effect residual = hidden_states + residual``. After a routed call the dispatcher evaluates
each effect's expression on the call's inputs, before any output is written back (the
write-back may overwrite an input the expression reads), then writes the outputs back and
copies each effect's value into its target. The fallback to the original API needs none of
this: the API does its own writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fibgen.codegen.files import GeneratedFile, build_label, with_python_header
from fibgen.codegen.python.dispatch.call import call_recipe
from fibgen.codegen.python.dispatch.functions import Family, FunctionView
from fibgen.codegen.python.dispatch.ops import OpView
from fibgen.codegen.python.dispatch.plan import (
    TORCH_DTYPE,
    DispatchGenError,
    default_text,
    dtype_constant,
    forward_args,
    signature_text,
)
from fibgen.codegen.python.dispatch.rules import module_names
from fibgen.codegen.python.packages import CATALOGUE_PACKAGE, package_problem
from fibgen.codegen.python.pyformat import format_python
from fibgen.codegen.python.pyliteral import inline_dict, literal
from fibgen.codegen.templates import render, source_label
from fibgen.compiler import ir


@dataclass(frozen=True)
class ModuleView:
    """What the module template substitutes."""

    doc: str
    imports: tuple[str, ...]
    tables: tuple[str, ...]
    functions: tuple[FunctionView, ...]
    registration: tuple[str, ...]


# ---------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------

_RUNTIME_NAMES = ("ORIGINAL", "RETURNS", "SERVING", "register_api")


def _runtime_import(names: tuple[str, ...], signatures: Iterable[ir.ApiSignature | None]) -> str:
    """The runtime import line, with ApiDefault when a signature needs its placeholder."""
    params = [p for sig in signatures if sig is not None for p in sig.params]
    if any(p.default is not None and default_text(p.default) != p.default for p in params):
        names = names + ("ApiDefault",)
    return f"from fibgen.runtime.for_generated import {', '.join(sorted(names))}"


def _dict_lines(name: str, rows: Iterable[tuple[str, str]]) -> list[str]:
    # One entry per line with a trailing comma, which black keeps; an empty one as black has it.
    rows = list(rows)
    if not rows:
        return [f"{name} = {{}}"]
    return [f"{name} = {{", *(f"    {k}: {v}," for k, v in rows), "}"]


def _family_module(
    family: ir.Family,
    definitions: list[ir.Definition],
    label: str,
    patch: bool,
    then: str | None,
    foreign: frozenset[str] = frozenset(),
    namespace: str = "fibgen",
) -> ModuleView:
    view = Family(family, definitions, label)
    rule = view.name_rule()
    fields, replaced = view.routable(view.key_fields(rule))
    if replaced:
        # Routed by a derived size: only the instances' own values have names.
        rule = None
    plan = view.rule_plan(fields)
    dispatcher = view.dispatcher(fields, plan)
    functions = []
    tables = _dict_lines("_KNOWN", ((k, literal(n)) for k, n in view.known(fields)))
    if family.dtype_params:
        choices = sorted({c for d in family.dtype_params for c in d.choices})
        parts = ((TORCH_DTYPE[c], literal(ir.DTYPE_NAME_PART[c])) for c in choices)
        tables += _dict_lines("_DTYPE_PARTS", parts)
    if rule is not None:
        functions.append(view.name_function(rule, fields))
    # References are embedded once per distinct text and compiled on first use only.
    texts: dict[str, str] = {}
    for d in view.defs:
        if d.reference is not None:
            texts.setdefault(d.reference, f"_REFERENCE_{len(texts)}")
    if family.reference is not None:
        texts.setdefault(family.reference, f"_REFERENCE_{len(texts)}")
    tables += [f"{const} = {literal(text)}" for text, const in texts.items()]
    tables += _dict_lines(
        "_REFERENCES",
        ((literal(d.name), texts[d.reference]) for d in view.defs if d.reference is not None),
    )
    # Note [rules]: what the checks are called, and the definition values they read.
    tables.append(f"_RULES = {literal(tuple(plan.names))}")
    described = {
        t.name: (
            (
                t.dtype.name
                if t.dtype.kind == "concrete" and t.dtype.name not in view.dtype_params
                else None
            ),
            list(t.shape),  # a list: the comma of a 1-tuple would make black explode it
        )
        for t in family.inputs
        if t.shape is not None
    }
    # One statement: format_python hands it to black whole when it is too long.
    tables.append("_TENSORS = " + inline_dict(described))
    # Note [output buffers]: the caller's buffers a rule checks, for the refusal's message.
    buffers = {}
    for index in sorted(plan.buffers):
        o = next(o for o in family.outputs if f"tensor:{o.name}" == plan.names[index])
        target = view.targets[o.name]
        assert target is not None and o.shape is not None  # only such outputs are checked
        concrete = o.dtype.kind == "concrete" and o.dtype.name not in view.dtype_params
        dtype = o.dtype.name if concrete else None
        buffers[o.name] = (target[1], dtype, list(o.shape))
    if buffers:
        tables.append("_BUFFERS = " + inline_dict(buffers))
    if plan.values:
        rows = []
        for d in view.defs:
            given = dict(d.param_values)
            rows.append((literal(d.name), literal(tuple(given[p] for p in plan.values))))
        tables += _dict_lines("_VALUES", rows)
        declared = {p.name: p.default for p in family.params}
        defaults = tuple(declared.get(p) for p in plan.values)
        tables.append(f"_DEFAULTS = {literal(defaults) if None not in defaults else None}")
    if family.params:
        # Parameter values of a name no instance declares: its name's fields, else defaults.
        tables.append(
            "_PARAM_DEFAULTS = "
            + literal({p.name: p.default for p in family.params if p.default is not None})
        )
    if foreign:
        tables.append(f"_FOREIGN = frozenset({literal(tuple(sorted(foreign)))})")
    tables += _constants(family)
    runtime_names = _RUNTIME_NAMES + (("INPLACE",) if view.inplace_capable() else ())
    imports = ["import torch", "", _runtime_import(runtime_names, (family.api, family.plan))]
    # The math the rules use: `math.sqrt`, or a bare `sqrt` as in constraints.
    spelled = [line for fn in functions + [dispatcher] for line in fn.body]
    spelled += [c.condition for c in plan.capture_checks + plan.call_checks + plan.const_checks]
    spelled += plan.capture_lets + [line for _, line in plan.call_lets]
    maths = module_names([line.strip() for line in spelled])
    if "math" in maths:
        imports.insert(0, "import math")
    bare = sorted(maths - {"math"})
    if bare:
        imports.insert(imports.index("import torch") + 1, f"from math import {', '.join(bare)}")
    if plan.helpers:
        imports.append(
            f"from fibgen.runtime.for_generated import {', '.join(sorted(plan.helpers))}"
        )
    options = [
        f"path={literal(family.api.path if family.api else None)}",
        f"patch={patch}",
        "known=_KNOWN",
        f"name_rule={'_name' if rule is not None else None}",
        f"inputs={literal(tuple(t.name for t in family.inputs))}",
        f"outputs={literal(tuple(t.name for t in family.outputs))}",
        "references=_REFERENCES",
        f"family_reference={texts.get(family.reference) if family.reference else None}",
        "rules=_RULES",
        "tensors=_TENSORS",
    ]
    if buffers:
        options.append("buffers=_BUFFERS")
    if plan.values:
        options += ["values=_VALUES", "defaults=_DEFAULTS"]
    if family.params:
        options += [
            f"params={literal(tuple(p.name for p in family.params))}",
            "param_defaults=_PARAM_DEFAULTS",
            f"key_fields={literal(tuple(fields))}",
        ]
    if foreign:
        options.append("foreign=_FOREIGN")
    # Note [api calls]: the API call of a definition's inputs, for bench and tools.
    run_call, plan_call, call_problem = call_recipe(view)
    if call_problem is None:
        tables.append(f"_CALL = {literal(run_call)}")
        options.append("call=_CALL")
        if plan_call is not None:
            tables.append(f"_PLAN_CALL = {literal(plan_call)}")
            options.append("plan_call=_PLAN_CALL")
        used = sorted(
            {
                arg
                for entries in (run_call, plan_call or ())
                for _, how, arg in entries
                if how == "param"
            }
        )
        if used:
            rows = []
            for d in view.defs:
                given = dict(d.param_values)
                declared = {p.name: p.default for p in family.params}
                rows.append(
                    (literal(d.name), inline_dict({u: given.get(u, declared.get(u)) for u in used}))
                )
            tables += _dict_lines("_CALL_PARAMS", rows)
            options.append("call_params=_CALL_PARAMS")
    else:
        options.append(f"call_problem={literal(call_problem)}")
    if view.inplace_capable():
        options.append("inplace=True")
    if plan.const_checks:
        functions.append(view.const_function(fields, plan))
        options.append("const_check=_const_check")
    registration = [
        f"_api = register_api({literal(label)}, {family.name}, {{options}})",
        "_routes = _api.routes",
        # Note [native reads] (fibgen/runtime/checking/result_check.py): globals, rebound there.
        "_same, _shape_of, _dtype_of = _api.checks(globals())",
    ]
    if family.plan is not None:
        functions.append(view.capture_function(plan))
        options += [f"plan_path={literal(family.plan.path)}", "capture=_capture"]
        # Plan-time arguments per wrapper instance, kept by the runtime under weak keys.
        registration.append("_plans = _api.plans")
    if then is not None:
        # Another family stands for the same API: a call this one cannot route goes there.
        imports.append(f"from . import {then} as _then")
        options.append(f"then=_then.{then}")
    functions += view.trace_functions(plan)
    options += [
        f"op_type={literal(family.op_type)}",
        "trace_inputs=_inputs",
        "trace_axes=_var_axes",
    ]
    functions.append(dispatcher)
    # Note [custom ops]: what torch.compile traces instead of the dispatcher.
    ops = OpView(view, fields, plan, forward_args(view.params), signature_text(view.params))
    functions.append(FunctionView(*ops.compiled()))
    if ops.reason is None:
        functions += [FunctionView(*ops.impl()), FunctionView(*ops.fake())]
        imports.append(
            "from fibgen.runtime.for_generated import decode as _decode, fresh as _fresh, pack as _pack"
        )
        registration += list(ops.registration(namespace, view.known(fields)))
    if family.api is not None:
        doc = f"Dispatcher of family {family.name}: routes ``{family.api.path}`` to solutions."
    else:
        doc = f"Dispatcher of family {family.name}: routes calls to solutions or the reference."
    registration[0] = registration[0].format(options=", ".join(options))
    return ModuleView(doc, tuple(imports), tuple(tables), tuple(functions), tuple(registration))


def _constants(family: ir.Family) -> list[str]:
    """Module-level names of the torch objects the hot path compares against."""
    names = sorted(
        {
            t.dtype.name
            for t in family.inputs + family.outputs
            if t.dtype.kind == "concrete"
            and t.dtype.name not in {d.name for d in family.dtype_params}
        }
    )
    # Dynamo folds is_dynamo_compiling to True where it traces; eagerly it is a function that
    # returns False, which costs a third of is_compiling's (which asks torch.jit first): 0.08
    # µs of a hit on the 2-core machine. (torch before 2.3 has only is_compiling.)
    compiling = (
        '_compiling = getattr(torch.compiler, "is_dynamo_compiling", None) '
        "or torch.compiler.is_compiling"
    )
    return ["_Tensor = torch.Tensor", compiling] + [
        f"{dtype_constant(n)} = {TORCH_DTYPE[n]}" for n in names
    ]


def _group_module(group: ir.DispatchGroup, families: dict[str, ir.Family]) -> ModuleView:
    members = []
    for case in group.cases:
        for name in case.families:
            family = families.get(name)
            if family is None:
                raise DispatchGenError(f"{group.span}: dispatch {group.name}: no family {name}")
            if family.api is None:
                raise DispatchGenError(
                    f"{group.span}: dispatch {group.name}: family {family.name} declares no api"
                )
        members.append((case, families[case.family]))
    first = members[0][1]
    api = first.api
    assert api is not None  # the compiler's dispatch check: each case's family has an api
    for _, family in members[1:]:
        if family.api != api:
            raise DispatchGenError(
                f"{group.span}: dispatch {group.name}: families {first.name} and {family.name} "
                "declare different APIs; a dispatch group stands for one API"
            )
    if group.selector not in api.param_names():
        raise DispatchGenError(
            f"{group.span}: dispatch {group.name}: selector {group.selector} is not a parameter "
            f"of {api.path}"
        )
    forward = forward_args(api.params)
    body = (
        "if _api.direct is not None:",
        f"    return _api.direct({forward})",
        f"_family = _FAMILIES.get({group.selector})",
        "if _family is None:",
        f"    return _api.miss({forward})",
        f"return _family({forward})",
    )
    dispatcher = FunctionView(
        group.name,
        signature_text(api.params),
        f"Route ``{api.path}`` by ``{group.selector}`` to its family's dispatcher.",
        body,
    )
    names = sorted({f.name for _, f in members})
    imports = (
        _runtime_import(("register_api",), (api,)),
        "",
        *(f"from . import {n} as _{n}" for n in names),
    )
    rows = ((literal(c.value), f"_{f.name}.{f.name}") for c, f in members)
    return ModuleView(
        f"Dispatcher of {api.path}: {group.selector} picks the family, which routes the call.",
        imports,
        tuple(_dict_lines("_FAMILIES", rows)),
        (dispatcher,),
        (f"_api = register_api({literal(api.path)}, {group.name}, path={literal(api.path)})",),
    )


def _package_module(apis: dict[str, str], definitions: dict[str, str]) -> ModuleView:
    tables = (
        *_dict_lines("APIS", ((literal(p), literal(m)) for p, m in sorted(apis.items()))),
        *_dict_lines(
            "DEFINITIONS", ((literal(d), literal(m)) for d, m in sorted(definitions.items()))
        ),
        "",
        "register_package(__name__, APIS, DEFINITIONS)",
    )
    return ModuleView(
        "Generated dispatchers: import a module to route its API to registered solutions.",
        ("from fibgen.runtime.for_generated import register_package",),
        tables,
        (),
        (),
    )


def emit_python_dispatch(module: ir.Module, package: str) -> list[GeneratedFile]:
    """Generate ``python/<package>/`` for a compiled module: one file per family and group."""
    views, sources = plan_dispatch(module, package)
    names = sorted(views)
    # Written as black writes but for long statements, which format_python hands to black.
    texts = format_python(
        [render("python_dispatch.py.j2", view=views[n]) for n in names],
        written_in_black_style=True,
    )
    files = [
        GeneratedFile(
            f"python/{package}/{name}.py",
            # The package index is made of the whole build: it names the build's sources.
            with_python_header(text, source_label(sources[name]) or build_label(module)),
            source_label(sources[name]),
        )
        for name, text in zip(names, texts)
    ]
    return sorted(files, key=lambda f: f.path)


def plan_dispatch(module: ir.Module, package: str) -> tuple[dict[str, ModuleView], dict[str, str]]:
    """Decide every dispatcher module (raising DispatchGenError), without printing them.

    ``fibgen check`` runs this too, so that it reports what ``fibgen build`` would.
    """
    problem = package_problem(package)
    if problem is not None:
        raise DispatchGenError(f"package name {package!r} {problem}")
    sources = {f.name: sf.path for sf in module.files for f in sf.families}
    sources |= {g.name: sf.path for sf in module.files for g in sf.dispatches}
    families = {f.name: f for f in module.families()}
    grouped = {name for g in module.dispatches() for case in g.cases for name in case.families}
    definitions: dict[str, list[ir.Definition]] = {name: [] for name in families}
    for d in module.definitions:
        definitions.setdefault(d.family, []).append(d)
    apis: dict[str, str] = {}
    by_definition: dict[str, str] = {}
    views: dict[str, ModuleView] = {}

    def claim(path: str, owner: str) -> None:
        if path in apis:
            raise DispatchGenError(
                f"{apis[path]} and {owner} both stand for {path}; a dispatch group cannot share "
                "its API with a family outside it"
            )
        apis[path] = owner

    # Families outside dispatch groups that stand for one API form a chain, in source order:
    # the first patches the API, and each passes the calls it cannot route to the next.
    chains: dict[str, list[str]] = {}
    for family in module.families():
        if family.api is not None and family.name not in grouped:
            chains.setdefault(family.api.path, []).append(family.name)
    # A dispatch case of several families chains them likewise; only its first is entered.
    case_chains = [
        list(case.families)
        for g in module.dispatches()
        for case in g.cases
        if len(case.families) > 1
    ]
    all_chains = list(chains.values()) + case_chains
    then = {a: b for chain in all_chains for a, b in zip(chain, chain[1:])}
    heads = {chain[0] for chain in chains.values()}
    # Names another family of the same API declares: a name rule never claims them.
    foreign: dict[str, frozenset[str]] = {}
    for chain in all_chains:
        for member in chain:
            foreign[member] = frozenset(
                d.name for other in chain if other != member for d in definitions[other]
            )
    for name in sorted(families):
        family = families[name]
        label = family.api.path if family.api is not None else f"{package}.{name}"
        views[name] = _family_module(
            family,
            definitions[name],
            label,
            name in heads,
            then.get(name),
            foreign.get(name, frozenset()),
            "fibgen" if package == CATALOGUE_PACKAGE else package,
        )
        if name in heads:
            assert family.api is not None  # chains are of families with an api
            claim(family.api.path, name)
        by_definition.update((d.name, name) for d in definitions[name])
    for group in sorted(module.dispatches(), key=lambda g: g.name):
        if group.name in views:
            raise DispatchGenError(f"{group.span}: dispatch {group.name}: a family has that name")
        views[group.name] = _group_module(group, families)
        group_api = families[group.cases[0].family].api
        assert group_api is not None  # checked by _group_module
        claim(group_api.path, group.name)
    # The package index gathers every file: an aggregate, whose source is left empty.
    views["__init__"] = _package_module(apis, by_definition)
    sources["__init__"] = ""
    return views, sources
