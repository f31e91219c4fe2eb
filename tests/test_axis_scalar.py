"""Var axes bound by an integer scalar input (`n : var scalar`), through the whole pipeline.

The parser and printer, the checker's rules (its diagnostics are the fixtures
`var_axis_scalar_*` of test_diagnostics.py), the definition JSON (as FlashInfer's trace
templates write it, and as flashinfer-bench 0.1.2 loads it), input generation, workload
materialization, output allocation, and the var-axis key of a selection table (Note [axes
bound by a scalar] in fibgen/compiler/ir.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from _shared import require_flashinfer_bench

from fibgen.codegen.definition_json import definition_dict
from fibgen.compiler import compile_sources, ir
from fibgen.compiler.formatter import format_text
from fibgen.curation.workloads import WorkloadError, materialize
from fibgen.format.models import Definition, Workload, var_axis_scalars
from fibgen.runtime.errors import Decline
from fibgen.runtime.inputs.generator import Generator
from fibgen.runtime.inputs.specs import InputSpec
from fibgen.runtime.selection.entries import keyed_entry
from fibgen.runtime.selection.policy import Policy
from fibgen.runtime.selection.table import ORIGINAL, _bindings
from fibgen.runtime.solutions.loading import allocate_outputs

SOURCE = textwrap.dedent('''
    family widen {
      op_type demo
      axes {
        rows  : var
        width : var scalar "Output width."
      }
      constraints {
        width >= 3
      }
      inputs {
        x     : float32[rows]
        width : int32 scalar
      }
      outputs {
        y : float32[rows, width]
      }
      reference """
        import torch

        def run(x, width):
            return x[:, None] * torch.arange(width, dtype=x.dtype)
      """
    }
    ''')


def _compile(text: str = SOURCE):
    result = compile_sources([("t.fidef", "t.fidef", text)])
    assert result.module is not None, [d.message for d in result.diagnostics]
    return result.module


@pytest.fixture(scope="module")
def widen() -> dict:
    (d,) = _compile().definitions
    return definition_dict(d)


def test_the_parser_reads_var_scalar_and_fmt_writes_it_back():
    module = _compile()
    (family,) = module.families()
    axes = {a.name: a for a in family.axes}
    assert isinstance(axes["width"], ir.VarAxis) and axes["width"].scalar
    assert not axes["rows"].scalar
    (d,) = module.definitions
    assert [(a.name, a.scalar) for a in d.axes] == [("rows", False), ("width", True)]
    printed, _ = format_text(SOURCE, "t.fidef")
    assert 'width : var scalar "Output width."' in printed
    assert _compile(printed).families() == module.families()


def test_the_json_is_a_var_axis_and_an_integer_scalar_of_one_name(widen):
    assert widen["axes"]["width"] == {"type": "var", "description": "Output width."}
    assert widen["inputs"]["width"] == {"shape": None, "dtype": "int32"}
    assert widen["outputs"]["y"]["shape"] == ["rows", "width"]
    assert Definition.model_validate(widen).scalar_axes == {"width": "width"}


def test_only_a_required_integer_scalar_of_an_uncarried_var_axis_binds_it():
    axes = {"n": {"type": "var"}, "m": {"type": "var"}, "c": {"type": "const", "value": 2}}
    inputs = {"x": {"shape": ["m"], "dtype": "float32"}, "n": {"shape": None, "dtype": "int64"}}
    assert var_axis_scalars(axes, inputs) == {"n": "n"}
    for changed in (
        {"dtype": "float32"},  # not an integer
        {"optional": True},  # may be None
        {"shape": []},  # a 0-D tensor, not a scalar
    ):
        assert var_axis_scalars(axes, {**inputs, "n": {**inputs["n"], **changed}}) == {}
    carried = {"x": {"shape": ["m", "n"], "dtype": "float32"}, "n": inputs["n"]}
    assert var_axis_scalars(axes, carried) == {}  # a shape carries it: read from the shape


def test_flashinfer_bench_loads_it_and_sizes_a_workload_from_its_axes(widen):
    fib = require_flashinfer_bench()
    loaded = fib.Definition.model_validate(widen)
    assert loaded.var_axes == ["rows", "width"]
    assert loaded.get_input_shapes({"rows": 2, "width": 5}) == [[2], None]
    assert loaded.get_output_shapes({"rows": 2, "width": 5}) == [[2, 5]]


def test_generated_inputs_give_the_scalar_the_axis_value(widen):
    spec = InputSpec.from_definition_json(widen)
    assert spec.scalar_axes() == {"width": "width"}
    given = Generator(spec, {"rows": 2, "width": 6}, seed=0)
    values = given.run()
    assert values["width"] == 6 and given.axes["width"] == 6
    chosen = Generator(spec, {"rows": 2}, seed=0)
    values = chosen.run()
    assert values["width"] == chosen.axes["width"] >= 3  # the constraint raised the default


def test_a_workload_whose_scalar_disagrees_with_its_axis_is_refused(widen):
    spec = InputSpec.from_definition_json(widen)

    def workload(value: int) -> Workload:
        return Workload.model_validate(
            {
                "uuid": "u1",
                "axes": {"rows": 2, "width": 5},
                "inputs": {"x": {"type": "random"}, "width": {"type": "scalar", "value": value}},
            }
        )

    assert materialize(spec, workload(5))["width"] == 5
    with pytest.raises(WorkloadError, match="value of var axis 'width'.*gives as 5"):
        materialize(spec, workload(4))


def test_output_buffers_are_sized_by_the_scalar(widen):
    out = allocate_outputs(widen, {"x": torch.zeros(3), "width": 7})
    assert out["y"].shape == (3, 7)
    with pytest.raises(ValueError, match="cannot size output 'y'.*width"):
        allocate_outputs(widen, {"x": torch.zeros(3), "width": -1})


def test_a_keyed_selection_reads_the_key_from_the_scalar(widen):
    assert _bindings(widen) == [["x", 0], ["width", None]]
    keyed = {
        "inputs": ["x", "width"],
        "outputs": ["y"],
        "bind": _bindings(widen),
        "keys": [[[2, 3], ORIGINAL]],
        "trusted": [],
        "dps": False,
        "reference": widen["reference"],
    }
    info = {"keyed": keyed, "ranking": [], "solutions": {}}
    run = keyed_entry(Path("."), "widen", info, Policy(on_miss="reference")).fn
    assert run is not None
    with pytest.raises(Decline, match=r"at var-axis values \(2, 3\)"):
        run(x=torch.ones(2), width=3)  # the traced key: the API's own function was faster
    y = run(x=torch.ones(2), width=4)  # another width: a miss, served by the reference
    assert torch.equal(y, torch.arange(4.0).expand(2, 4))
