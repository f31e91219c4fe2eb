"""The check of a call's inputs against a definition's contract, as tracing and hand-written
``apply`` make it (Note [written-out checks] in fibgen/runtime/tracing/checks.py): written out
per definition, it says what a plain reading of the contract says, with either reader."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from _shared import REQUIRE_OPTIONAL

from fibgen.runtime.checking import result_check
from fibgen.runtime.tracing.checks import checker, contract

DEFINITION = {
    "axes": {
        "n": {"type": "var"},
        "m": {"type": "var"},
        "h": {"type": "const", "value": 8},
    },
    "inputs": {
        "x": {"shape": ["n", "h"], "dtype": "bfloat16"},
        "scale": {"shape": None, "dtype": "float32"},  # a scalar: not checked
        "residual": {"shape": ["n", "h"], "dtype": "bfloat16"},
        "table": {"shape": ["m", "m"], "dtype": "int32"},
        "bias": {"shape": ["h"], "dtype": None},  # optional, any dtype
    },
    "outputs": {"y": {"shape": ["n", "h"], "dtype": "bfloat16"}},
}
INPUTS = tuple(DEFINITION["inputs"])
DTYPES = {"bfloat16": torch.bfloat16, "int32": torch.int32, "float32": torch.float32}


def plain(values):
    """The contract read as it is written: the first input that differs, or None."""
    tensors, consts = contract(DEFINITION)
    seen = {}
    for name, dtype, shape in tensors:
        value = values[INPUTS.index(name)]
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            return name
        if dtype is not None and value.dtype is not DTYPES[dtype]:
            return name
        if value.ndim != len(shape):
            return name
        for d, axis in enumerate(shape):
            if axis in consts and value.shape[d] != consts[axis]:
                return name
            if seen.setdefault(axis, value.shape[d]) != value.shape[d]:
                return name
    return None


def calls(count: int):
    """Calls near the contract: each input right, or one thing about it wrong."""
    rng = random.Random(0)

    def tensor(shape, dtype):
        return torch.zeros(shape, dtype=dtype)

    for _ in range(count):
        n, m = rng.choice([1, 3]), rng.choice([2, 5])
        x = rng.choice([tensor((n, 8), torch.bfloat16)] * 4 + [tensor((n, 7), torch.bfloat16)])
        residual = rng.choice(
            [tensor((n, 8), torch.bfloat16)] * 3
            + [tensor((n + 1, 8), torch.bfloat16), tensor((n, 8), torch.float16)]
        )
        table = rng.choice(
            [tensor((m, m), torch.int32)] * 3
            + [tensor((m, m + 1), torch.int32), tensor((m,), torch.int32), [[0]]]
        )
        bias = rng.choice([None, tensor((8,), torch.float64), tensor((9,), torch.bfloat16)])
        yield (x, 0.5, residual, table, bias)


@pytest.mark.parametrize("reader", ["python", "native"])
def test_the_written_out_check_says_what_the_contract_says(reader, monkeypatch):
    if reader == "native":
        from fibgen.runtime.launch.native import build_native

        try:
            module = build_native()  # cached per machine
        except Exception as exc:
            if REQUIRE_OPTIONAL:
                raise
            pytest.skip(f"the extension module does not build here: {exc}")
        shape_of, dtype_of = module.shape_of, module.dtype_of
    else:
        shape_of, dtype_of = result_check.shape_python, result_check.dtype_python
    # The readers a check uses are looked up per call: as after a background build.
    monkeypatch.setitem(result_check._state, "shape_of", shape_of)
    monkeypatch.setitem(result_check._state, "dtype_of", dtype_of)
    tensors, consts = contract(DEFINITION)
    check = checker(INPUTS, tensors, consts)
    outcomes = {"passed": 0, "failed": 0}
    for values in itertools.islice(calls(400), 400):
        expected = plain(values)
        failed = check(values)
        assert (failed and failed[0]) == expected, values
        outcomes["failed" if failed else "passed"] += 1
    # Both outcomes were reached often enough for the comparison to mean something.
    assert min(outcomes.values()) > 40, outcomes


def test_a_failing_call_is_said_with_its_reason():
    tensors, consts = contract(DEFINITION)
    check = checker(INPUTS, tensors, consts)
    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    table = torch.zeros(2, 2, dtype=torch.int32)
    assert check((x, None, x, table, None)) is None
    assert check((x, None, torch.zeros(4, 8, dtype=torch.bfloat16), table, None)) == (
        "residual",
        "input residual has size 4 along axis n (dim 0), expected 3 as in x (dim 0)",
    )
    assert check((x, None, x, torch.zeros(2, 3, dtype=torch.int32), None)) == (
        "table",
        "input table has size 3 along axis m (dim 1), expected 2 as in table (dim 0)",
    )
    assert check((x, None, x, table, "bias")) == ("bias", "input bias is a str, not a tensor")


def test_the_result_check_of_hand_written_calls_reads_each_outputs_shape_off_the_call():
    from fibgen.runtime.routing.handwritten import _result_check

    definition = {
        "axes": {
            "n": {"type": "var"},
            "h": {"type": "const", "value": 8},
            "k": {"type": "var"},
            "free": {"type": "var"},
        },
        "inputs": {
            "x": {"shape": ["n", "h"], "dtype": "bfloat16"},
            "k": {"shape": None, "dtype": "int32"},  # binds axis k by name
        },
        "outputs": {
            "y": {"shape": ["n", "h"], "dtype": "bfloat16"},
            "top": {"shape": ["n", "k"], "dtype": "int64"},
            "extra": {"shape": ["free"], "dtype": "float32"},  # no input binds it
        },
    }
    check = _result_check(definition)
    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    y, top = torch.zeros(3, 8, dtype=torch.bfloat16), torch.zeros(3, 2, dtype=torch.int64)
    extra = torch.zeros(11)
    assert check((x, 2), (y, top, extra)) is None
    # An axis no input binds: held to its dtype and rank.
    assert check((x, 2), [y, top, torch.zeros(1)]) is None
    square = torch.zeros(2, 2)
    assert check((x, 2), (y, top, square)) == ("extra", square, (torch.float32, None, x.device))
    assert check((x, 2), (y, top)) == (None, (y, top), None)
    assert check((x, 2), y) == (None, y, None)
    bad = torch.zeros(3, 3, dtype=torch.int64)
    assert check((x, 2), (y, bad, extra)) == ("top", bad, (torch.int64, (3, 2), x.device))
    assert check((x, 2), (y.float(), top, extra))[0] == "y"
    assert check((x, 2), (y, top, "extra")) == ("extra", "extra", (torch.float32, None, x.device))
