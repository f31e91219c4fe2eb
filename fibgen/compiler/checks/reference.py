"""Checks of a reference: valid Python with a top-level `run` that takes the inputs."""

from __future__ import annotations

import ast

from fibgen.compiler import ir
from fibgen.compiler.checks.common import CheckerBase, FamilyView
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python


class ReferenceChecks(CheckerBase):
    """The reference parses and its `run` takes the inputs."""

    def _reference(self, v: FamilyView) -> None:
        fam = v.family
        if fam.reference is not None:
            self._reference_text(v, fam.reference, fam.reference_span)
        for inst in fam.instances:
            if inst.reference is not None:
                self._reference_text(v, inst.reference, inst.reference_span)

    def _reference_text(self, v: FamilyView, text: str, span: ir.Span) -> None:
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
