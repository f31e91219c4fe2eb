"""Checks of how a family reads its API: parameters, plan, tuple elements, write-backs, effects."""

from __future__ import annotations

from fibgen.compiler import ir, rules
from fibgen.compiler.checks.common import (
    EXPR_BUILTINS,
    CheckerBase,
    FamilyView,
    did_you_mean,
    names_in,
    sub_span,
)


class ApiChecks(CheckerBase):
    """How a family reads its API's parameters and what it writes back."""

    def _api(self, v: FamilyView) -> None:
        fam = v.family
        # Parameters, the keywords a `**` parameter carries, and names made by `let`.
        sc = rules.scope(fam, EXPR_BUILTINS)
        api = set(sc.run) | {n for n in sc.lets if "." not in n} if fam.api else None
        plan = (
            set(sc.plan) | {n[5:] for n in sc.lets if n.startswith("plan.")} if fam.plan else None
        )
        # Set exactly when `api` and `plan` are.
        api_path = fam.api.path if fam.api else None
        plan_path = fam.plan.path if fam.plan else None
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
                        f"input `{t.name}` is not a parameter of `{api_path}`",
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
                        f"`plan.{src.param}` is not a parameter of `{plan_path}`",
                        src.span,
                        help=did_you_mean(src.param, plan, "parameters"),
                    )
            elif api is None:
                self.err(
                    f"`<- {src.param}` but the family declares no `api`",
                    src.span,
                    help="declare the API it reads from: `api pkg.mod.func(...)`",
                )
            elif src.param not in api:
                self.err(
                    f"`{src.param}` is not a parameter of `{api_path}`",
                    src.span,
                    help=did_you_mean(src.param, api, "parameters"),
                )
        self._tuple_reads(fam)
        for t in fam.outputs:
            if t.target is None:
                continue
            # An API parameter, or an input: the tensor that input reads (an element of a
            # tuple parameter, say) is written in place.
            targets = (api or set()) | set(v.inputs)
            if t.target not in targets:
                where = f"a parameter of `{api_path}` or an input" if api else "an input"
                self.err(
                    f"write-back target `{t.target}` of `{t.name}` is not {where}",
                    t.span,
                    help=did_you_mean(t.target, targets, "names"),
                )

    def _effects(self, v: FamilyView) -> None:
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
                    help=did_you_mean(e.target, params, "parameters"),
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
            for name, offset in names_in(e.expr.text):
                if name not in known:
                    self.err(
                        f"unknown name `{name}` in effect",
                        sub_span(e.expr.span, offset, len(name)),
                        help="an effect is computed from the definition's inputs (and `torch`); "
                        + did_you_mean(name, v.inputs, "inputs"),
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
