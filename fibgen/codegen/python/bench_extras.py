"""The benchmark sidecar: what a definition's JSON has no field for, beside that JSON.

``definitions/<op_type>/<name>.fibgen`` holds JSON ``{"tolerance": {...}, "hints": {...}}``:
the family's ``tolerance(...)`` and its inputs' ``gen`` hints, which the benchmark runner
(``fibgen.bench.runner.load_extras``) uses to compare outputs and make valid inputs. The
suffix is not ``.json``, so flashinfer-bench's loader, which reads every JSON file under
``definitions/``, never sees it. Written only for definitions that have either.
"""

from __future__ import annotations

import json

from fibgen.codegen.files import GeneratedFile
from fibgen.compiler import ir


def emit_bench_extras(module: ir.Module) -> list[GeneratedFile]:
    """One sidecar per definition whose family declares a tolerance or generation hints."""
    families = {f.name: f for f in module.families()}
    files = []
    for defn in sorted(module.definitions, key=lambda d: d.name):
        family = families.get(defn.family)
        if family is None:
            continue
        data: dict = {}
        if family.tolerance is not None:
            t = family.tolerance
            given = {"atol": t.atol, "rtol": t.rtol, "matched": t.matched}
            data["tolerance"] = {k: v for k, v in given.items() if v is not None}
        hints = {
            t.name: f"{t.gen.kind}({', '.join(_hint_args(t.gen))})"
            for t in family.inputs
            if t.gen is not None
        }
        if hints:
            data["hints"] = hints
        if data:
            files.append(
                GeneratedFile(
                    path=f"definitions/{defn.op_type}/{defn.name}.fibgen",
                    text=json.dumps(data, indent=2, sort_keys=True) + "\n",
                    source=defn.source_file,
                )
            )
    return files


def _hint_args(gen: ir.GenHint) -> list[str]:
    return [a.text for a in gen.args] + [f"{k}={v.text}" for k, v in gen.kwargs]
