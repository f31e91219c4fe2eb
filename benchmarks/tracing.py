"""Tracing overhead: an untraced call against traced calls, in one process.

Run from the repository root:

    python benchmarks/tracing.py

The kernel is a no-op (it returns its input) behind a generated dispatcher whose original
API is the no-op itself, so a row is the dispatcher's own cost. Rows: tracing off; tracing
on with dump policy "none" (axes and random inputs only); dump "all" of a 1x64 fp32 tensor.
Every traced call is kept (dedup "all") and the writer thread runs meanwhile, as in a
serving process. The overhead column subtracts the untraced call.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import tempfile
import timeit
import types
from pathlib import Path

# Run as a script, sys.path[0] is benchmarks/, whose scripts would shadow modules of the same
# name (select.py shadows the standard library's); the repository root is what is needed.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch  # noqa: E402

import fibgen.runtime as rt  # noqa: E402
from fibgen.codegen.python.dispatch.emit import emit_python_dispatch  # noqa: E402
from fibgen.compiler import ir  # noqa: E402

API_MODULE = "fibgen_tracing_bench_api"
PACKAGE = "fibgen_tracing_bench_kernels"


def noop(x, out=None):
    """The no-op kernel: returns its input."""
    return x


def _generate() -> types.ModuleType:
    module = types.ModuleType(API_MODULE)
    module.noop = noop
    sys.modules[API_MODULE] = module
    tensor = ir.Tensor(
        name="x", dtype=ir.DtypeRef(kind="concrete", name="float32"), shape=("n", "h")
    )
    family = ir.Family(
        name="noop",
        op_type="bench",
        api=ir.ApiSignature(
            path=f"{API_MODULE}.noop",
            params=(
                ir.ApiParam(name="x", kind="positional"),
                ir.ApiParam(name="out", kind="positional", default="None"),
            ),
        ),
        axes=(ir.VarAxis(name="n"), ir.ConstAxis(name="h", abbrev="h")),
        inputs=(tensor,),
        outputs=(tensor.model_copy(update={"name": "y", "target": "out"}),),
        instances=(ir.Instance(values=(ir.Assignment(key="h", value=64),)),),
    )
    definition = ir.Definition(
        name="noop_h64",
        op_type="bench",
        description=None,
        tags=(),
        axes=(),
        constraints=(),
        inputs=(),
        outputs=(),
        reference=None,
        family="noop",
        source_file="benchmarks/tracing.py",
        instance_index=0,
        consts=(("h", 64),),
    )
    module = ir.Module(
        files=(ir.SourceFile(path="benchmarks/tracing.py", families=(family,)),),
        definitions=(definition,),
    )
    out = Path(tempfile.mkdtemp(prefix="fibgen-tracing-bench-"))
    for f in emit_python_dispatch(module, PACKAGE):
        (out / f.path).parent.mkdir(parents=True, exist_ok=True)
        (out / f.path).write_text(f.text, encoding="utf-8")
    sys.path.insert(0, str(out / "python"))
    return importlib.import_module(f"{PACKAGE}.noop")


def per_call_us(fn, number: int = 20000, repeat: int = 7) -> float:
    """Median microseconds per call of ``fn()`` over ``repeat`` loops of ``number`` calls."""
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    """Print one table: untraced, traced with dump none, traced with dump all."""
    dispatch = _generate().noop
    x = torch.randn(1, 64)
    dataset = Path(tempfile.mkdtemp(prefix="fibgen-tracing-dataset-"))
    rows = [("direct call (no dispatcher)", per_call_us(lambda: noop(x)))]
    rows.append(("dispatcher, tracing off", per_call_us(lambda: dispatch(x))))
    for label, dump in (("dump none", "none"), ("dump all, 1x64 fp32", "all")):
        # A fresh dataset per row, and caps high enough that no record is dropped.
        rt.enable_tracing(
            dataset / dump, dump=dump, max_pending_records=10**7, max_pending_bytes=1 << 32
        )
        dispatch(x)
        # Fewer calls with dump all: each one writes a blob file.
        number = 20000 if dump == "none" else 2000
        rows.append(
            (f"dispatcher, tracing on, {label}", per_call_us(lambda: dispatch(x), number=number))
        )
        rt.disable_tracing()
        stats = rt.tracing_stats()
        assert stats["dropped"] == 0 and stats["written"] == stats["recorded"], stats
    rows.append(("dispatcher, tracing off again", per_call_us(lambda: dispatch(x))))
    base = rows[1][1]
    print(f"{'case':<48} {'us/call':>9} {'overhead':>9}")
    for case, us in rows:
        print(f"{case:<48} {us:>9.3f} {us - base:>+9.3f}")


if __name__ == "__main__":
    main()
