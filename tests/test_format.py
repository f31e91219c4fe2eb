"""Tests of fibgen.format: the data model, canonical JSON, and the dataset layout."""

from __future__ import annotations

import copy
import json
import keyword
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from _shared import require_shared
from hypothesis import given, settings
from hypothesis import strategies as st

from fibgen.format import (
    DTYPES,
    Definition,
    FormatError,
    Solution,
    Trace,
    Workload,
    append_traces,
    append_workloads,
    definition_path,
    dump_definition,
    dump_solution,
    dump_trace_line,
    load_blob,
    load_definition,
    load_definitions,
    load_jsonl,
    load_solution,
    load_safetensors_input,
    load_solutions,
    load_traces,
    load_workloads,
    parse_definition,
    parse_jsonl,
    parse_solution,
    save_blob,
    semantic_equal,
    workload_problems,
    write_definition,
    write_solution,
)
from fibgen.format.dataset import pack_solution, read_solution, write_text_atomic
from fibgen.format.errors import FormatWarning
from fibgen.format.jsonio import parse_trace_line, validate_obj

# ---------------------------------------------------------------------------------------
# Small documents written here, so the rejection tests do not depend on the shared dataset.

REFERENCE = "import torch\n\ndef run(x, w):\n    return x * w\n"


def _definition() -> dict[str, Any]:
    return {
        "name": "scale_h8",
        "description": "Scale rows by a weight.",
        "op_type": "scale",
        "tags": ["status:verified"],
        "axes": {
            "batch_size": {"type": "var"},
            "hidden": {"type": "const", "value": 8, "description": "hidden size"},
        },
        "constraints": ["batch_size >= 1"],
        "inputs": {
            "x": {"shape": ["batch_size", "hidden"], "dtype": "bfloat16"},
            "w": {"shape": ["hidden"], "dtype": "float32", "description": "weight"},
        },
        "outputs": {"y": {"shape": ["batch_size", "hidden"], "dtype": "bfloat16"}},
        "reference": REFERENCE,
    }


def _solution() -> dict[str, Any]:
    return {
        "name": "scale_h8_py",
        "definition": "scale_h8",
        "author": "alice",
        "spec": {
            "language": "python",
            "target_hardware": ["cpu"],
            "entry_point": "main.py::run",
        },
        "sources": [{"path": "main.py", "content": "def run(x, w, y):\n    y.copy_(x * w)\n"}],
    }


def _workload(**axes: int) -> dict[str, Any]:
    return {
        "uuid": "0000-1111",
        "axes": axes or {"batch_size": 4},
        "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
    }


def _trace(evaluation: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "definition": "scale_h8",
        "solution": "scale_h8_py",
        "workload": _workload(),
        "evaluation": evaluation,
    }


def _evaluation(status: str, correctness: bool, performance: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "status": status,
        "environment": {"hardware": "cpu", "libs": {"torch": "2.4"}},
        "timestamp": "2025-01-01T00:00:00Z",
        "log": "",
    }
    if correctness:
        out["correctness"] = {"max_relative_error": 0.001, "max_absolute_error": 0.002}
    if performance:
        out["performance"] = {"latency_ms": 1.0, "reference_latency_ms": 2.0, "speedup_factor": 2.0}
    return out


def _error(model: type, obj: Any) -> str:
    with pytest.raises(FormatError) as info:
        validate_obj(model, obj, "f.json")
    return str(info.value)


# ---------------------------------------------------------------------------------------
# The real dataset


def _dataset_definition_files() -> list[Path]:
    root = require_shared("flashinfer-trace", "definitions")
    return sorted(root.glob("*/*.json"))


def test_dataset_has_156_definitions_and_26_workload_files() -> None:
    root = require_shared("flashinfer-trace")
    assert len(_dataset_definition_files()) == 156
    assert len(load_definitions(root)) == 156
    assert len(load_workloads(root)) == 26


@pytest.mark.slow
def test_every_dataset_definition_round_trips() -> None:
    for path in _dataset_definition_files():
        source = json.loads(path.read_text(encoding="utf-8"))
        defn = load_definition(path)
        text = dump_definition(defn)
        assert semantic_equal(source, json.loads(text)), path
        assert semantic_equal(source, defn), path
        assert parse_definition(text) == defn, path
        # Dumping is deterministic and canonical text is a fixed point.
        assert dump_definition(defn) == text, path
        assert dump_definition(parse_definition(text)) == text, path


def test_optional_tensor_extension_is_kept() -> None:
    defs = load_definitions(require_shared("flashinfer-trace"))
    optional = [(d.name, n) for d in defs.values() for n, t in d.inputs.items() if t.optional]
    assert len(optional) == 9
    name, tensor = optional[0]
    assert '"optional": true' in dump_definition(defs[name])


@pytest.mark.slow
def test_every_dataset_workload_loads_and_matches_its_definition() -> None:
    root = require_shared("flashinfer-trace")
    defs = load_definitions(root)
    workloads = load_workloads(root)
    assert sum(len(w) for w in workloads.values()) == 663
    for name, items in workloads.items():
        for workload in items:
            assert workload_problems(defs[name], workload) == [], (name, workload.uuid)


def test_dataset_workload_lines_round_trip() -> None:
    root = require_shared("flashinfer-trace", "workloads")
    for path in sorted(root.glob("*/*.jsonl")):
        traces = load_jsonl(path)
        lines = [dump_trace_line(t) for t in traces]
        assert [json.loads(line) for line in lines] == [
            json.loads(line) for line in path.read_text().splitlines() if line.strip()
        ]
        assert parse_jsonl("\n".join(lines)) == traces


def test_schema_enums_match_the_models() -> None:
    schemas = require_shared("reference", "schemas")
    definition = json.loads((schemas / "definition.json").read_text())
    assert tuple(definition["$defs"]["DType"]["enum"]) == DTYPES
    solution = json.loads((schemas / "solution.json").read_text())
    languages = solution["$defs"]["SupportedLanguages"]["enum"]
    for language in languages:
        obj = _solution()
        obj["spec"]["language"] = language
        assert validate_obj(Solution, obj).spec.language == language
    trace = json.loads((schemas / "trace.json").read_text())
    for status in trace["$defs"]["EvaluationStatus"]["enum"]:
        passed = status == "PASSED"
        needs_correctness = status in ("PASSED", "INCORRECT_NUMERICAL")
        obj = _trace(_evaluation(status, needs_correctness, passed))
        assert validate_obj(Trace, obj).evaluation.status.value == status


# ---------------------------------------------------------------------------------------
# Canonical JSON


def test_definition_dump_key_order_and_layout() -> None:
    defn = validate_obj(Definition, _definition())
    text = dump_definition(defn)
    assert list(json.loads(text)) == [
        "name",
        "description",
        "op_type",
        "tags",
        "axes",
        "constraints",
        "inputs",
        "outputs",
        "reference",
    ]
    assert text.endswith("}\n")
    assert text.startswith('{\n  "name": "scale_h8",\n')
    assert '"hidden": {\n      "type": "const",\n      "value": 8,\n      "description"' in text
    assert '"optional"' not in text


def test_definition_dump_omits_null_description_and_keeps_empty_constraints() -> None:
    obj = _definition()
    obj["description"] = None
    del obj["constraints"]
    out = json.loads(dump_definition(validate_obj(Definition, obj)))
    assert "description" not in out
    assert out["constraints"] == []


def test_dump_keeps_non_ascii() -> None:
    obj = _definition()
    obj["description"] = "Größe µ"
    assert "Größe µ" in dump_definition(validate_obj(Definition, obj))


def test_semantic_equal_rules() -> None:
    a = _definition()
    reordered = dict(reversed(list(a.items())))
    assert semantic_equal(a, reordered)
    no_constraints = copy.deepcopy(a)
    no_constraints["constraints"] = []
    without = copy.deepcopy(no_constraints)
    del without["constraints"]
    assert semantic_equal(no_constraints, without)
    swapped_inputs = copy.deepcopy(a)
    swapped_inputs["inputs"] = dict(reversed(list(a["inputs"].items())))
    assert not semantic_equal(a, swapped_inputs)
    swapped_axes = copy.deepcopy(a)
    swapped_axes["axes"] = dict(reversed(list(a["axes"].items())))
    assert not semantic_equal(a, swapped_axes)
    changed = copy.deepcopy(a)
    changed["axes"]["hidden"]["value"] = 16
    assert not semantic_equal(a, changed)


def test_solution_round_trip_and_defaults() -> None:
    solution = validate_obj(Solution, _solution())
    assert solution.spec.destination_passing_style is True
    assert solution.spec.dependencies == []
    assert solution.spec.binding is None
    assert (solution.spec.entry_file, solution.spec.entry_symbol) == ("main.py", "run")
    text = dump_solution(solution)
    assert parse_solution(text) == solution
    assert dump_solution(parse_solution(text)) == text
    assert list(json.loads(text)) == ["name", "definition", "author", "spec", "sources"]


def test_workload_line_format() -> None:
    trace = Trace(definition="scale_h8", workload=validate_obj(Workload, _workload()))
    line = dump_trace_line(trace)
    assert line == (
        '{"definition":"scale_h8","solution":null,"workload":{"uuid":"0000-1111",'
        '"axes":{"batch_size":4},"inputs":{"x":{"type":"random"},"w":{"type":"random"}}},'
        '"evaluation":null}'
    )
    assert trace.is_workload_trace


def test_scalar_values_keep_their_json_type() -> None:
    obj = _workload()
    obj["inputs"] = {
        "a": {"type": "scalar", "value": 1},
        "b": {"type": "scalar", "value": 0.5},
        "c": {"type": "scalar", "value": True},
    }
    workload = validate_obj(Workload, obj)
    values = [workload.inputs[k].value for k in "abc"]
    assert [type(v) for v in values] == [int, float, bool]


def test_inf_and_nan_are_written_as_strings_and_read_back() -> None:
    evaluation = _evaluation("INCORRECT_NUMERICAL", True, False)
    evaluation["correctness"] = {
        "max_relative_error": float("inf"),
        "max_absolute_error": float("nan"),
        "extra": {"worst": float("-inf")},
    }
    trace = validate_obj(Trace, _trace(evaluation))
    line = dump_trace_line(trace)
    assert '"max_relative_error":"Infinity"' in line
    assert '"max_absolute_error":"NaN"' in line
    assert '"worst":"-Infinity"' in line
    again = parse_trace_line(line)
    assert math.isinf(again.evaluation.correctness.max_relative_error)
    assert math.isnan(again.evaluation.correctness.max_absolute_error)


def test_workload_axis_zero_is_accepted() -> None:
    # The dataset itself has "num_pages": 0 (gqa_paged prefill), and flashinfer-bench allows it.
    assert validate_obj(Workload, _workload(batch_size=0)).axes == {"batch_size": 0}


# ---------------------------------------------------------------------------------------
# Rejected inputs, with the message a curator sees


def _mutated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj = _definition()
    change(obj)
    return obj


BAD_DEFINITIONS = [
    (
        "reference without run",
        lambda d: d.update(reference="def main(x, w):\n    return x\n"),
        "f.json: reference: defines no top-level function 'run' "
        "(the reference must contain 'def run(...)' at module level)",
    ),
    (
        "run nested in a class",
        lambda d: d.update(reference="class K:\n    def run(self):\n        pass\n"),
        "f.json: reference: defines no top-level function 'run'",
    ),
    (
        "reference syntax error",
        lambda d: d.update(reference="def run(x, w):\n    return x *\n"),
        "f.json: reference: not valid Python: invalid syntax (line 2, column",
    ),
    (
        "overlapping names",
        lambda d: d["outputs"].update(x={"shape": ["hidden"], "dtype": "float32"}),
        "f.json: outputs.x: the name 'x' is also an input; "
        "input and output names must be different",
    ),
    (
        "constraint is a statement",
        lambda d: d.update(constraints=["batch_size = 4"]),
        "f.json: constraints[0]: 'batch_size = 4' is not a Python expression",
    ),
    (
        "undeclared shape axis",
        lambda d: d["inputs"]["x"].update(shape=["batch_size", "hiden"]),
        "f.json: inputs.x.shape[1]: axis 'hiden' is not declared in 'axes'",
    ),
    (
        "bad dtype",
        lambda d: d["inputs"]["w"].update(dtype="fp32"),
        "f.json: inputs.w.dtype: \"fp32\" is not allowed; expected 'float32', 'float16'",
    ),
    (
        "unknown axis type",
        lambda d: d["axes"]["hidden"].update(type="fixed"),
        "f.json: axes.hidden: \"type\" is \"fixed\"; expected one of 'var', 'const'",
    ),
    (
        "axis without type",
        lambda d: d["axes"]["hidden"].pop("type"),
        'f.json: axes.hidden: missing required key "type"',
    ),
    (
        "const axis without value",
        lambda d: d["axes"]["hidden"].pop("value"),
        'f.json: axes.hidden: missing required key "value"',
    ),
    (
        "negative const",
        lambda d: d["axes"]["hidden"].update(value=-8),
        "f.json: axes.hidden.value: must be >= 0, got -8",
    ),
    (
        "tensor without dtype",
        lambda d: d["inputs"]["w"].pop("dtype"),
        'f.json: inputs.w: missing required key "dtype"',
    ),
    (
        "misspelt key: the missing one, then the unknown one",
        lambda d: d["inputs"]["w"].update(dtpye=d["inputs"]["w"].pop("dtype")),
        "f.json: 2 problems:\n"
        '  - inputs.w: missing required key "dtype"\n'
        '  - inputs.w: unknown key "dtpye" ignored (allowed keys: shape, dtype, description, '
        "optional)",
    ),
    (
        "empty name",
        lambda d: d.update(name=""),
        "f.json: name: must not be an empty string",
    ),
    (
        "empty tag",
        lambda d: d.update(tags=["ok", ""]),
        "f.json: tags[1]: must not be an empty string",
    ),
    (
        "shape is a string",
        lambda d: d["inputs"]["w"].update(shape="hidden"),
        'f.json: inputs.w.shape: expected a list, got a string "hidden"',
    ),
]


def test_unknown_keys_are_ignored_with_a_warning_naming_each() -> None:
    # flashinfer-bench ignores keys it does not know (a newer writer's fields); so does
    # fibgen, but it says where each one is.
    obj = _definition()
    obj["axes"]["hidden"]["size"] = 8
    obj["inputs"]["x"]["layout"] = "row-major"
    obj["version"] = 2
    with pytest.warns(FormatWarning) as caught:
        defn = validate_obj(Definition, obj, "f.json")
    assert defn == validate_obj(Definition, _definition())
    (warning,) = caught
    assert str(warning.message) == (
        'f.json: axes.hidden: unknown key "size" ignored (allowed keys: type, value, '
        'description); inputs.x: unknown key "layout" ignored (allowed keys: shape, dtype, '
        'description, optional); (top level): unknown key "version" ignored (allowed keys: '
        "name, description, op_type, tags, axes, constraints, inputs, outputs, reference)"
    )


def test_unknown_keys_in_every_model_are_warnings_not_errors() -> None:
    solution = _solution()
    solution["spec"]["compile_flags"] = ["-O3"]
    solution["sources"][0]["mode"] = "0644"
    with pytest.warns(FormatWarning, match=r'spec: unknown key "compile_flags" ignored'):
        validate_obj(Solution, solution, "s.json")
    trace = _trace(_evaluation("PASSED", True, True))
    trace["evaluation"]["performance"]["p50_ms"] = 1.0
    trace["workload"]["inputs"]["x"]["seed"] = 3
    with pytest.warns(FormatWarning) as caught:
        parse_trace_line(json.dumps(trace), "t.jsonl", 4)
    message = str(caught[0].message)
    assert message.startswith('t.jsonl:4: workload.inputs.x: unknown key "seed" ignored')
    assert 'evaluation.performance: unknown key "p50_ms" ignored' in message


def test_every_model_refuses_unknown_keys() -> None:
    # validate_obj looks for unknown keys only when a value does not validate as it is: sound
    # while every model refuses them, so that a value with one never validates as it is.
    import inspect

    import fibgen.format.models as models
    from pydantic import BaseModel

    classes = [c for _, c in inspect.getmembers(models, inspect.isclass)]
    found = [c for c in classes if issubclass(c, BaseModel)]
    assert len(found) >= 16
    assert [c.__name__ for c in found if c.model_config.get("extra") != "forbid"] == []


@pytest.mark.parametrize(
    "change,expected", [c[1:] for c in BAD_DEFINITIONS], ids=[c[0] for c in BAD_DEFINITIONS]
)
def test_bad_definition_is_rejected(
    change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    assert _error(Definition, _mutated(change)).startswith(expected)


def test_all_definition_problems_are_reported_together() -> None:
    def change(d: dict[str, Any]) -> None:
        d["reference"] = "def main(): pass"
        d["constraints"] = ["a ="]
        d["inputs"]["x"]["shape"] = ["nope"]

    message = _error(Definition, _mutated(change))
    assert message.startswith("f.json: 3 problems:\n  - reference: defines no top-level")
    assert "\n  - constraints[0]: 'a =' is not a Python expression" in message
    assert "\n  - inputs.x.shape[0]: axis 'nope' is not declared in 'axes'" in message


def _solution_with(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj = _solution()
    change(obj)
    return obj


BAD_SOLUTIONS = [
    (
        "entry point without ::",
        lambda s: s["spec"].update(entry_point="main.py:run"),
        "f.json: spec.entry_point: entry point 'main.py:run' must have the form "
        "'<file>::<function>' with exactly one '::' (found 0)",
    ),
    (
        "entry point with two ::",
        lambda s: s["spec"].update(entry_point="main.py::K::run"),
        "f.json: spec.entry_point: entry point 'main.py::K::run' must have the form "
        "'<file>::<function>' with exactly one '::' (found 2)",
    ),
    (
        "entry point without symbol",
        lambda s: s["spec"].update(entry_point="main.py::"),
        "f.json: spec.entry_point: entry point 'main.py::' must name both a file and a function",
    ),
    (
        "source path with ..",
        lambda s: s["sources"][0].update(path="../main.py"),
        "f.json: sources[0].path: source path '../main.py' contains '..'; "
        "a source may not leave the solution directory",
    ),
    (
        "absolute source path",
        lambda s: s["sources"][0].update(path="/tmp/main.py"),
        "f.json: sources[0].path: source path '/tmp/main.py' is absolute; "
        "use a path relative to the solution",
    ),
    (
        "entry file not among sources",
        lambda s: s["spec"].update(entry_point="kernel.py::run"),
        "f.json: spec.entry_point: the entry file 'kernel.py' is not among the sources "
        "('main.py')",
    ),
    (
        "duplicate source path",
        lambda s: s["sources"].append({"path": "main.py", "content": "x = 1\n"}),
        "f.json: sources[1].path: duplicate source path 'main.py'",
    ),
    (
        "empty target_hardware",
        lambda s: s["spec"].update(target_hardware=[]),
        "f.json: spec.target_hardware: must not be empty",
    ),
    (
        "no sources",
        lambda s: s.update(sources=[]),
        "f.json: sources: must not be empty",
    ),
    (
        "unknown language",
        lambda s: s["spec"].update(language="rust"),
        "f.json: spec.language: \"rust\" is not allowed; expected 'python', 'triton'",
    ),
    (
        "unknown binding",
        lambda s: s["spec"].update(binding="pybind"),
        "f.json: spec.binding: \"pybind\" is not allowed; expected 'tvm-ffi' or 'torch'",
    ),
    (
        "empty source content",
        lambda s: s["sources"][0].update(content=""),
        "f.json: sources[0].content: must not be an empty string",
    ),
]


@pytest.mark.parametrize(
    "change,expected", [c[1:] for c in BAD_SOLUTIONS], ids=[c[0] for c in BAD_SOLUTIONS]
)
def test_bad_solution_is_rejected(change: Callable[[dict[str, Any]], None], expected: str) -> None:
    assert _error(Solution, _solution_with(change)).startswith(expected)


BAD_TRACES = [
    (
        "negative workload axis",
        {"definition": "d", "workload": _workload(batch_size=-1)},
        "f.json: workload.axes.batch_size: must be >= 0, got -1",
    ),
    (
        "unknown input type",
        {
            "definition": "d",
            "workload": {"uuid": "u", "axes": {}, "inputs": {"x": {"type": "zeros"}}},
        },
        "f.json: workload.inputs.x: \"type\" is \"zeros\"; expected one of 'random', 'scalar', "
        "'safetensors'",
    ),
    (
        "safetensors input without key",
        {
            "definition": "d",
            "workload": {
                "uuid": "u",
                "axes": {},
                "inputs": {"x": {"type": "safetensors", "path": "blob/x.safetensors"}},
            },
        },
        'f.json: workload.inputs.x: missing required key "tensor_key"',
    ),
    (
        "scalar without a number",
        {
            "definition": "d",
            "workload": {
                "uuid": "u",
                "axes": {},
                "inputs": {"x": {"type": "scalar", "value": None}},
            },
        },
        "f.json: workload.inputs.x.value: a scalar value must be a number or true/false, got null",
    ),
    (
        "PASSED without correctness",
        _trace(_evaluation("PASSED", False, True)),
        "f.json: evaluation.correctness: required when status is PASSED",
    ),
    (
        "PASSED without performance",
        _trace(_evaluation("PASSED", True, False)),
        "f.json: evaluation.performance: required when status is PASSED",
    ),
    (
        "INCORRECT_NUMERICAL with performance",
        _trace(_evaluation("INCORRECT_NUMERICAL", True, True)),
        "f.json: evaluation.performance: only allowed when status is PASSED, "
        "not INCORRECT_NUMERICAL",
    ),
    (
        "RUNTIME_ERROR with correctness",
        _trace(_evaluation("RUNTIME_ERROR", True, False)),
        "f.json: evaluation.correctness: only allowed when status is PASSED or "
        "INCORRECT_NUMERICAL, not RUNTIME_ERROR",
    ),
    (
        "unknown status",
        _trace(_evaluation("OK", False, False)),
        "f.json: evaluation.status: \"OK\" is not allowed; expected 'PASSED'",
    ),
    (
        "negative latency",
        _trace(
            {
                **_evaluation("PASSED", True, True),
                "performance": {"latency_ms": -1.0},
            }
        ),
        "f.json: evaluation.performance.latency_ms: must be >= 0.0, got -1.0",
    ),
    (
        "empty hardware",
        _trace({**_evaluation("TIMEOUT", False, False), "environment": {"hardware": ""}}),
        "f.json: evaluation.environment.hardware: must not be an empty string",
    ),
]


@pytest.mark.parametrize(
    "obj,expected", [c[1:] for c in BAD_TRACES], ids=[c[0] for c in BAD_TRACES]
)
def test_bad_trace_is_rejected(obj: dict[str, Any], expected: str) -> None:
    assert _error(Trace, obj).startswith(expected)


def test_json_syntax_error_names_line_and_column() -> None:
    with pytest.raises(FormatError) as info:
        parse_definition('{\n  "name": "x",\n  "op_type" "y"\n}\n', "defs/x.json")
    err = info.value
    assert (err.path, err.line, err.col) == ("defs/x.json", 3, 13)
    assert str(err) == "defs/x.json:3:13: invalid JSON: Expecting ':' delimiter"


def test_duplicate_json_key_is_rejected() -> None:
    with pytest.raises(FormatError, match='duplicate key "name"'):
        parse_definition('{"name": "a", "name": "b"}', "x.json")


def test_jsonl_errors_name_the_line() -> None:
    good = dump_trace_line(Trace(definition="d", workload=validate_obj(Workload, _workload())))
    bad = good.replace('"batch_size":4', '"batch_size":-4')
    with pytest.raises(FormatError) as info:
        parse_jsonl("\n".join([good, "", bad]), "w.jsonl")
    assert str(info.value) == "w.jsonl:3: workload.axes.batch_size: must be >= 0, got -4"
    with pytest.raises(FormatError) as info:
        parse_jsonl(good + "\n{oops\n", "w.jsonl")
    assert str(info.value).startswith("w.jsonl:2:2: invalid JSON: Expecting property name")


def test_format_error_pickles_and_renders() -> None:
    err = FormatError("a.json", "broken", 3, 7)
    assert str(err) == "a.json:3:7: broken"
    assert str(FormatError("a.json", "broken")) == "a.json: broken"
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.message, again.line, again.col) == ("a.json", "broken", 3, 7)
    assert isinstance(err, ValueError)


def test_models_are_frozen() -> None:
    defn = validate_obj(Definition, _definition())
    with pytest.raises(Exception):
        defn.name = "other"  # type: ignore[misc]


def test_var_and_const_axes() -> None:
    defn = validate_obj(Definition, _definition())
    assert defn.var_axes == ["batch_size"]
    assert defn.const_axes == {"hidden": 8}
    workload = validate_obj(Workload, _workload(batch_size=2, hidden=8))
    assert workload_problems(defn, workload) == [
        "workload.axes: ['hidden'] are not var axes of 'scale_h8'"
    ]


# ---------------------------------------------------------------------------------------
# Property: any well-formed definition survives dump -> parse.

# Names become Python identifiers in constraints and references: keywords are not names.
_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n) and not keyword.issoftkeyword(n)
)


@st.composite
def _definitions(draw: st.DrawFn) -> Definition:
    axis_names = draw(st.lists(_names, min_size=1, max_size=4, unique=True))
    axes = {
        n: (
            {"type": "var"}
            if draw(st.booleans())
            else {"type": "const", "value": draw(st.integers(0, 1 << 20))}
        )
        for n in axis_names
    }
    tensor_names = draw(st.lists(_names, min_size=2, max_size=5, unique=True))
    split = draw(st.integers(1, len(tensor_names) - 1))

    def tensor() -> dict[str, Any]:
        shape = draw(st.none() | st.lists(st.sampled_from(axis_names), max_size=3))
        out: dict[str, Any] = {"shape": shape, "dtype": draw(st.sampled_from(DTYPES))}
        if draw(st.booleans()):
            out["description"] = draw(st.text(max_size=10))
        if draw(st.booleans()):
            out["optional"] = True
        return out

    return validate_obj(
        Definition,
        {
            "name": draw(_names),
            "description": draw(st.none() | st.text(max_size=20)),
            "op_type": draw(_names),
            "tags": draw(st.lists(st.text(min_size=1, max_size=8), max_size=3)),
            "axes": axes,
            "constraints": draw(st.lists(st.sampled_from(axis_names), max_size=2)),
            "inputs": {n: tensor() for n in tensor_names[:split]},
            "outputs": {n: tensor() for n in tensor_names[split:]},
            "reference": "def run(*args):\n    return args\n",
        },
    )


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(_definitions())
def test_dump_parse_round_trip_property(defn: Definition) -> None:
    text = dump_definition(defn)
    assert parse_definition(text) == defn
    assert dump_definition(parse_definition(text)) == text


# ---------------------------------------------------------------------------------------
# Dataset layout on disk


def test_write_and_load_dataset(tmp_path: Path) -> None:
    defn = validate_obj(Definition, _definition())
    path = write_definition(tmp_path, defn)
    assert path == tmp_path / "definitions" / "scale" / "scale_h8.json"
    assert path == definition_path(tmp_path, "scale", "scale_h8")
    solution = validate_obj(Solution, _solution())
    spath = write_solution(tmp_path, solution, defn.op_type)
    assert spath == tmp_path / "solutions/alice/scale/scale_h8/scale_h8_py.json"
    workload = validate_obj(Workload, _workload())
    append_workloads(tmp_path, "scale", "scale_h8", [workload])
    append_workloads(tmp_path, "scale", "scale_h8", [workload])
    trace = validate_obj(Trace, _trace(_evaluation("PASSED", True, True)))
    [tpath] = append_traces(tmp_path, "scale", [trace])
    # Where flashinfer-bench's own TraceSet.add_traces writes.
    assert tpath == tmp_path / "traces/scale/scale_h8.jsonl"
    append_traces(tmp_path, "scale", [trace])

    assert load_definitions(tmp_path) == {"scale_h8": defn}
    assert load_solutions(tmp_path) == [solution]
    assert load_workloads(tmp_path) == {"scale_h8": [workload, workload]}
    assert load_traces(tmp_path) == [trace, trace]
    # No temporary files are left behind next to the data.
    leftovers = [p.name for p in tmp_path.rglob("*.tmp")]
    assert leftovers == []


def test_readers_take_every_depth_and_the_definition_from_the_content(tmp_path: Path) -> None:
    # flashinfer-bench's TraceSet.from_path reads every file at any depth: its add_traces
    # writes traces/<op_type>/<def>.jsonl, its merge traces/<def>.jsonl, older fibgen
    # traces/<author>/<op_type>/<def>.jsonl. The file's place says nothing about its content.
    defn = validate_obj(Definition, _definition())
    trace = validate_obj(Trace, _trace(_evaluation("PASSED", True, True)))
    workload = validate_obj(Workload, _workload())
    files = {
        "definitions/scale_h8.json": dump_definition(defn),
        "solutions/alice/s.json": json.dumps(_solution()),
        "workloads/everything.jsonl": dump_trace_line(
            Trace(definition="scale_h8", workload=workload)
        ),
        "traces/scale_h8.jsonl": dump_trace_line(trace),
        "traces/scale/scale_h8.jsonl": dump_trace_line(trace),
        "traces/bob/scale/deeper/scale_h8.jsonl": dump_trace_line(trace),
        # Temporary files and locks of a writer are not data.
        "traces/scale/.scale_h8.jsonl.123.tmp": "{half a line",
        "traces/.hidden/x.jsonl": "not json",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text + "\n")
    assert load_definitions(tmp_path) == {"scale_h8": defn}
    assert [s.name for s in load_solutions(tmp_path)] == ["scale_h8_py"]
    assert load_workloads(tmp_path) == {"scale_h8": [workload]}
    assert load_traces(tmp_path) == [trace, trace, trace]


def test_write_is_skipped_when_unchanged(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    assert write_text_atomic(target, "x\n") is True
    assert write_text_atomic(target, "x\n") is False
    assert write_text_atomic(target, "y\n") is True
    assert target.read_text() == "y\n"


def test_duplicate_definition_names_are_rejected_naming_both_files(tmp_path: Path) -> None:
    defn = validate_obj(Definition, _definition())
    first = write_definition(tmp_path, defn)
    second = tmp_path / "definitions" / "gemm" / "scale_h8.json"
    second.parent.mkdir(parents=True)
    second.write_text(dump_definition(defn))
    with pytest.raises(FormatError) as info:
        load_definitions(tmp_path)
    # Sorted order reads definitions/gemm/ first; the second file is the one reported.
    assert str(info.value) == f"{first}: definition name 'scale_h8' is also used by {second}"


def test_workload_file_with_results_is_rejected(tmp_path: Path) -> None:
    trace = validate_obj(Trace, _trace(_evaluation("TIMEOUT", False, False)))
    path = tmp_path / "workloads" / "scale" / "scale_h8.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(dump_trace_line(trace) + "\n")
    with pytest.raises(FormatError, match=r"scale_h8.jsonl:1: a workload file holds only"):
        load_workloads(tmp_path)


def test_a_record_holding_a_line_separator_character_is_one_line(tmp_path: Path) -> None:
    # JSON text written with ensure_ascii=False keeps U+2028 as it is; it ends no JSONL line.
    evaluation = _evaluation("RUNTIME_ERROR", False, False)
    evaluation["log"] = "first\u2028second\x85third"
    trace = validate_obj(Trace, _trace(evaluation))
    path = tmp_path / "traces" / "scale" / "scale_h8.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(dump_trace_line(trace) + "\n" + dump_trace_line(trace) + "\n", "utf-8")
    assert "\u2028" in path.read_text("utf-8")
    assert load_traces(tmp_path) == [trace, trace]


def test_trace_file_errors_name_file_and_line(tmp_path: Path) -> None:
    trace = validate_obj(Trace, _trace(_evaluation("TIMEOUT", False, False)))
    path = tmp_path / "traces" / "scale" / "scale_h8.jsonl"
    path.parent.mkdir(parents=True)
    broken = dump_trace_line(trace).replace('"TIMEOUT"', '"PASSED"')
    path.write_text(dump_trace_line(trace) + "\n" + broken + "\n")
    with pytest.raises(FormatError) as info:
        load_traces(tmp_path)
    assert str(info.value).startswith(f"{path}:2: 2 problems:\n  - evaluation.correctness:")


# ---------------------------------------------------------------------------------------
# Solution folders: the files are the truth, the JSON is packed from them


def _solution_folder(root: Path, name: str = "scale_h8_py") -> Path:
    obj = _solution()
    obj["name"] = name
    folder = root / "solutions" / "alice" / "scale" / "scale_h8" / name
    folder.mkdir(parents=True)
    (folder / f"{name}.json").write_text(json.dumps(obj))
    (folder / "main.py").write_text(obj["sources"][0]["content"])
    return folder


def test_a_solution_folder_is_read_from_its_files(tmp_path: Path) -> None:
    folder = _solution_folder(tmp_path)
    json_path = folder / "scale_h8_py.json"
    edited = "from .helper import twice\n\ndef run(x, w, y):\n    y.copy_(twice(x) * w)\n"
    (folder / "main.py").write_text(edited)
    (folder / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    # Caches and build outputs are not sources.
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\0\1")
    (folder / ".main.py.swp").write_bytes(b"\0")
    solution = read_solution(json_path)
    assert {s.path: s.content for s in solution.sources} == {
        "helper.py": "def twice(x):\n    return 2 * x\n",
        "main.py": edited,
    }
    (loaded,) = load_solutions(tmp_path)
    assert loaded == solution
    # The JSON itself is untouched until it is packed.
    assert json.loads(json_path.read_text())["sources"] == _solution()["sources"]

    packed = pack_solution(folder, check=True)
    assert packed.changed and json.loads(json_path.read_text())["sources"] == _solution()["sources"]
    packed = pack_solution(folder)
    assert packed.changed and packed.path == json_path
    assert load_solution(json_path) == solution
    assert pack_solution(json_path).changed is False
    out = tmp_path / "submit.json"
    assert pack_solution(folder, out).changed and load_solution(out) == solution


def test_a_json_outside_a_solution_folder_is_self_contained(tmp_path: Path) -> None:
    # flashinfer-bench's layout: several solutions of a definition side by side. A stray
    # main.py beside them is not any one solution's source.
    solution = validate_obj(Solution, _solution())
    path = write_solution(tmp_path, solution, "scale")
    (path.parent / "main.py").write_text("def run(x, w, y):\n    pass\n")
    assert read_solution(path) == solution
    with pytest.raises(FormatError, match="not a solution folder: the JSON of solution"):
        pack_solution(path)


@pytest.mark.parametrize(
    "content, message",
    [(b"", "empty; a Solution cannot hold an empty source"), (b"\xff\xfe", "not UTF-8 text")],
)
def test_a_bad_file_in_a_solution_folder_is_named(tmp_path: Path, content, message) -> None:
    folder = _solution_folder(tmp_path)
    (folder / "bad.py").write_bytes(content)
    with pytest.raises(FormatError, match=message) as info:
        read_solution(folder / "scale_h8_py.json")
    assert info.value.path == str(folder / "bad.py")


def test_names_that_would_escape_the_layout_are_refused(tmp_path: Path) -> None:
    obj = _definition()
    obj["name"] = "../evil"
    # The model refuses the name before any path is made of it (Note [safe names]).
    with pytest.raises(ValueError, match="name: '../evil' contains the path separator"):
        write_definition(tmp_path, validate_obj(Definition, obj))


def test_blob_round_trip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from fibgen.format import SafetensorsInput

    indptr = torch.tensor([0, 3, 5], dtype=torch.int32)
    rel = save_blob(tmp_path, "scale", "scale_h8", "u1", {"indptr": indptr})
    assert rel == "blob/workloads/scale/scale_h8/scale_h8_u1.safetensors"
    assert torch.equal(load_blob(tmp_path, rel)["indptr"], indptr)
    spec = SafetensorsInput(path="./" + rel, tensor_key="indptr")
    assert torch.equal(load_safetensors_input(tmp_path, spec), indptr)
    with pytest.raises(FormatError, match=r"no tensor 'indices' in the blob \(it has: indptr\)"):
        load_safetensors_input(tmp_path, SafetensorsInput(path=rel, tensor_key="indices"))
    with pytest.raises(ValueError, match="must be relative to the dataset root"):
        load_blob(tmp_path, "../outside.safetensors")


def test_importing_the_format_does_not_import_torch() -> None:
    code = (
        "import sys, fibgen.format, fibgen.format.models, fibgen.format.jsonio, "
        "fibgen.format.dataset; "
        "print(sorted(m for m in ('torch', 'safetensors', 'filelock') if m in sys.modules))"
    )
    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo, env=env
    ).stdout
    assert out.strip() == "[]"
