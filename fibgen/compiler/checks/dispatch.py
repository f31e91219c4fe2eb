"""Checks of dispatch groups: cases, families, one API, a selector it takes."""

from __future__ import annotations

from fibgen.compiler import ir
from fibgen.compiler.checks.common import CheckerBase, did_you_mean
from fibgen.compiler.checks.names import module_name_problem


class DispatchChecks(CheckerBase):
    """Dispatch groups: known families of one API, a selector they take."""

    def dispatch(self, group: ir.DispatchGroup, families: dict[str, ir.Family]) -> None:
        problem = module_name_problem(group.name)
        if problem is not None:
            self.err(
                f"dispatch group name `{group.name}` {problem}",
                group.name_span if group.name_span.line > 0 else group.span,
                help=f"the group's dispatcher is the module and function `{group.name}` of the "
                "generated package: choose another name",
            )
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
                        help=did_you_mean(name, families, "families"),
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
                        help=did_you_mean(group.selector, fam.api.param_names(), "parameters"),
                    )
        if len(apis) > 1:
            self.err(
                f"the families of dispatch `{group.name}` declare different APIs",
                group.span,
                help=f"found: {', '.join(sorted(apis))}",
            )
