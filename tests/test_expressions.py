"""Constraints and generation hints are a checked expression language, never Python's eval.

Note [checked expressions] in fibgen/format/expressions.py: text is held to a short list of
constructs where it enters (the compiler, the definition model, the sidecar reader, the
input spec) and interpreted by fibgen itself. Here: the escapes that `eval` with empty
`__builtins__` let through are refused at each entrance, with their position; the
interpreter computes what Python computes on the language, and refuses the work that would
not end (`9**9**9`) or would not fit (`x.shape * 10**9`); and every constraint and hint of
the catalogue and of the flashinfer-trace dataset is in the language and holds on the inputs
that are generated for it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from _shared import require_shared
from fibgen.format import FormatError, load_definition
from fibgen.format.dataset import read_extras
from fibgen.format.expressions import (
    EvaluationError,
    ExpressionError,
    check_expression,
    evaluate,
    expression_names,
)
from fibgen.runtime.inputs.make import InputGenerationError, InputSpec, generate_inputs

ROOT = Path(__file__).resolve().parents[1]

# What `eval(text, {"__builtins__": {}}, env)` ran, with `len` or a tensor in env.
ESCAPES = [
    ("len.__self__.__import__('os').system('touch M') == 0", 4, "the attribute `.__self__`"),
    ("x.__class__.__init__.__globals__['os'] == 0", 2, "the attribute `.__class__`"),
    ("n > 0 or [c for c in ().__class__.__base__.__subclasses__()] == []", 10, "a comprehension"),
    ("(lambda: 0)() == 0", 1, "calls functions by their names only, not a lambda"),
    ("getattr(x, 'shape') == 0", 1, "`getattr(...)` is not a function"),
    ("__import__('os') == 0", 1, "`__import__(...)` is not a function"),
    ("x.sum() > 0", 2, "the method `.sum()`"),
    ("n > 0 or 'a' == 'b'", 10, "a string cannot be used"),
    ("f'{n}' == 0", 1, "an f-string"),
    ("math.system", 5, "`math.system` cannot be used"),
    ("(n := 3) > 0", 2, "`:=`"),
    ("x @ x", 1, "the operator `@`"),
    ("n if n else 0", 1, "a conditional expression"),
    ("x[...] == 0", 3, "`Ellipsis` cannot be used"),
    ("min(x, key=abs)", 1, "`min` takes no keyword arguments"),
]


@pytest.mark.parametrize("text, column, message", ESCAPES)
def test_escapes_are_refused_where_they_are(text, column, message):
    with pytest.raises(ExpressionError) as caught:
        check_expression(text)
    assert message in caught.value.message
    assert (caught.value.line, caught.value.column) == (1, column)
    with pytest.raises(ExpressionError):
        evaluate(text, {"n": 1, "x": torch.zeros(2)}, (torch.Tensor,))


def test_a_position_on_a_continued_line_and_after_other_characters():
    with pytest.raises(ExpressionError) as caught:
        check_expression("n > 0 and (\n    é == x.__class__)")
    assert (caught.value.line, caught.value.column, caught.value.width) == (2, 11, 10)
    assert expression_names("n + sqrt(h) * x[i].item() + math.pi") == [
        ("n", 1, 1),
        ("h", 1, 10),
        ("x", 1, 15),
        ("i", 1, 17),
    ]


VALUES = {
    "len_indptr": 5,
    "batch_size": 4,
    "kv_indptr": torch.tensor([0, 3, 5, 9, 9]),
    "num_kv_indices": 9,
    "head_dim": 128,
    "x": torch.arange(6).reshape(2, 3),
    "EPS": 1e-6,
}


@pytest.mark.parametrize(
    "text, value",
    [
        ("len_indptr == batch_size + 1", True),
        ("num_kv_indices == kv_indptr[-1].item()", True),
        ("x.shape[-1] == 3 and x.shape[0] == 2", True),
        ("1 / sqrt(head_dim)", 1 / math.sqrt(128)),
        ("math.sqrt(head_dim) + math.pi", math.sqrt(128) + math.pi),
        ("2 ** 10 // 3 % 7 - -1", 2**10 // 3 % 7 + 1),
        ("1 < batch_size <= 4 < 5", True),
        ("1 < batch_size < 3", False),
        ("0 or batch_size", 4),
        ("batch_size and 0", 0),
        ("not batch_size", False),
        ("min(x.shape) + max(1, 2, 3) + len(kv_indptr) + int(2.7) + round(2.5)", 2 + 3 + 5 + 2 + 2),
        ("ceil(log2(head_dim + 1)) + floor(EPS) + abs(-2)", 8 + 0 + 2),
        ("kv_indptr[1:][0] == 3", True),
        ("x[1, 1:][1] == 5", True),
        ("inf > 1e308 and e < pi", True),
    ],
)
def test_the_language_computes_what_python_computes(text, value):
    got = evaluate(text, VALUES, (torch.Tensor,))
    got = got.item() if isinstance(got, torch.Tensor) else got
    assert got == value
    assert type(got) is type(value)
    assert got == eval(text, {"__builtins__": {}}, {**VALUES, **_MATH})  # the same as Python


_MATH = {
    "sqrt": math.sqrt,
    "log2": math.log2,
    "ceil": math.ceil,
    "floor": math.floor,
    "abs": abs,
    "min": min,
    "max": max,
    "len": len,
    "int": int,
    "round": round,
    "math": math,
    "inf": math.inf,
    "e": math.e,
    "pi": math.pi,
}


def test_tensors_compare_elementwise():
    got = evaluate("kv_indptr[1:] - kv_indptr[:-1] >= 0", VALUES, (torch.Tensor,))
    assert torch.equal(got, torch.tensor([True, True, True, True]))


@pytest.mark.parametrize(
    "text, reason",
    [
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 5000", "too large"),
        ("(2 ** 3000) * (2 ** 3000)", "more than 4096 bits"),
        ("x.shape * 1000000000", "applies to numbers and inputs, not a shape"),
        ("x.shape + x.shape", "not a shape"),
        ("x[0] * x[:, :1]", "would make 6 elements"),
        ("batch_size / 0", "ZeroDivisionError"),
        ("sqrt(-1)", "math domain error"),
        ("exp(1e6)", "OverflowError"),
        ("unknown + 1", "unknown name `unknown`"),
        ("kv_indptr[0.5]", "an index is an integer"),
        ("batch_size[0]", "an int cannot be subscripted"),
        ("batch_size.shape", "has no `.shape`"),
        ("len(batch_size)", "`len` takes an input or a shape"),
        ("min(batch_size)", "of one value takes a shape"),
        ("round(x)", "`round` cannot take a Tensor"),
        ("sqrt + 1", "`sqrt` is a function: call it"),
        ("x > 0 and 1", "Boolean value of Tensor"),
    ],
)
def test_what_has_no_value_is_an_evaluation_error(text, reason):
    with pytest.raises(EvaluationError, match=reason.replace("(", r"\(").replace("*", r"\*")):
        evaluate(text, VALUES, (torch.Tensor,))


def test_without_array_types_a_tensor_is_no_value_of_the_language():
    with pytest.raises(EvaluationError, match="has no `.shape`"):
        evaluate("x.shape[0] == 2", VALUES)


# ------------------------------------------------------------------ where text enters


def _definition_json(constraints: list[str]) -> dict:
    return {
        "name": "d",
        "op_type": "t",
        "axes": {"n": {"type": "var"}},
        "constraints": constraints,
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "def run(x):\n    return x\n",
    }


def test_a_definition_json_outside_the_language_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "d.json"
    escape = "len.__self__.__import__('os').system('touch M') == 0"
    path.write_text(json.dumps(_definition_json(["n >= 0", escape])), encoding="utf-8")
    with pytest.raises(FormatError) as caught:
        load_definition(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: constraints[1]: ")
    assert "the attribute `.__self__` cannot be used in a constraint" in message
    assert "(column 4)" in message


def test_a_sidecar_hint_outside_the_language_is_refused_naming_the_file(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(_definition_json([])), encoding="utf-8")
    sidecar = tmp_path / "d.fibgen"
    hints = {"x": "value(x.__class__)", "y": "indptr(over=1 + 2)", "z": "range(0, 1)"}
    sidecar.write_text(json.dumps({"hints": hints}), encoding="utf-8")
    with pytest.raises(FormatError) as caught:
        read_extras(tmp_path / "d.json")
    message = str(caught.value)
    assert message.startswith(f"{sidecar}: 2 problems:")
    assert "hints.x: argument `value` of `value`, `x.__class__`: the attribute" in message
    assert "hints.y: `over` of `indptr` names an input, not `1 + 2`" in message
    assert "hints.z" not in message


def test_an_input_spec_refuses_what_it_would_evaluate():
    axes = (("n", "var", None),)
    inputs = (("x", "float32", ("n",), False, None),)
    with pytest.raises(InputGenerationError, match=r"constraint `x.__class__ == 0`: the attr"):
        InputSpec("d", axes, inputs, ("x.__class__ == 0",))
    hinted = (("x", "float32", ("n",), False, ("value", ("len.__self__",), ())),)
    with pytest.raises(InputGenerationError, match="input `x`: argument `value` of `value`"):
        InputSpec("d", axes, hinted)


# ------------------------------------------------------------------ every real constraint


def _catalogue_extras() -> dict[str, dict]:
    return {
        p.stem: read_extras(p.with_suffix(".json"))
        for p in (ROOT / "generated" / "definitions").glob("*/*.fibgen")
    }


def _holds_on_generated_inputs(spec: InputSpec, budget: int = 64 * 2**20) -> bool:
    """Whether inputs were made (which checks every constraint); False when too large."""
    from fibgen.runtime.inputs.make import estimate_nbytes

    if estimate_nbytes(spec, {}) > budget:
        return False
    generate_inputs(spec, {}, seed=0)
    return True


def _holds_on_declared_shapes(spec: InputSpec) -> None:
    """Each constraint over shapes alone holds on tensors of the declared shapes (meta
    tensors: no memory), for definitions whose inputs are too large to make."""
    from fibgen.runtime.inputs.generator import Generator

    # The var axes as input generation derives them (solving `a * b == c` for the one still
    # unknown, the default for the first of several), without making any input.
    gen = Generator(spec, {}, seed=0)
    for name, _, _ in spec.axes:
        gen._propagate()
        if name not in gen.axes:
            gen.axes[name] = gen._default_axis(name)
    axes = dict(gen.axes)
    env = {**spec.params, **axes}
    for name, _, shape, _, _ in spec.inputs:
        if shape is not None:
            env[name] = torch.empty([axes[d] for d in shape], device="meta")
    for text in spec.constraints:
        assert ".item()" not in text, (spec.name, text)
        assert evaluate(text, env, (torch.Tensor,)) is True, (spec.name, text)


@pytest.mark.slow
def test_every_constraint_and_hint_of_the_catalogue_holds():
    from fibgen.compiler import compile_paths

    result = compile_paths([str(ROOT / "definitions")])
    assert result.ok
    families = {f.name: f for f in result.module.families()}
    made = 0
    constraints, hints = set(), set()
    for defn in result.module.definitions:
        family = families[defn.family]
        spec = InputSpec.from_ir(defn, family)
        constraints |= set(spec.constraints)
        hints |= {i[4] for i in spec.inputs if i[4] is not None}
        if _holds_on_generated_inputs(spec):
            made += 1
        else:
            _holds_on_declared_shapes(spec)
    assert len(constraints) >= 15 and len(hints) >= 20
    assert made >= 100


@pytest.mark.slow
def test_every_constraint_of_the_dataset_loads_and_holds():
    root = require_shared("flashinfer-trace", "definitions")
    extras = _catalogue_extras()
    paths = sorted(root.glob("*/*.json"))
    assert len(paths) == 156
    constraints = set()
    for path in paths:
        model = load_definition(path)  # the model checks each constraint (FormatError if not)
        d = json.loads(path.read_text(encoding="utf-8"))
        spec = InputSpec.from_definition_json(d, extras.get(model.name, {}).get("hints"))
        constraints |= set(spec.constraints)
        if not _holds_on_generated_inputs(spec):
            _holds_on_declared_shapes(spec)
    assert len(constraints) == 19
