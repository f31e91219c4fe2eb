"""Checks of what a routed call returns: `returns`, `result` rules, one API alike."""

from __future__ import annotations

from fibgen.compiler import ir
from fibgen.compiler.checks.common import CheckerBase, FamilyView, did_you_mean


class ReturnChecks(CheckerBase):
    """What a routed call returns, and that one API returns alike (Note [returns])."""

    def _returns(self, v: FamilyView) -> None:
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
                        else did_you_mean(name, v.outputs, "outputs")
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
            elif (written := _written_input(fam, out)) is not None:
                self.err(
                    f"`result {rule.target}` cannot change what is returned for "
                    f"`{rule.target}`",
                    rule.target_span,
                    help=f"`{rule.target}` is written into input "
                    f"`{written.name}`, and `returns` gives the caller's own "
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
            if first is None or first.returns is None:
                continue
            want = _count_values(len(first.returns.names))
            for fam in fams:
                if fam is first:
                    continue
                assert fam.api is not None  # grouped by its api
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
