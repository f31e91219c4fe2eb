"""Mutated inputs never crash the compiler, fmt or the importer, and never leave partial output.

The compiler's property (tests/_mutations.py mutates the catalogue's families): `fibgen
check` gives a module or errors with positions, and `fibgen fmt` gives text that formats to
itself and means the same, or errors. Never an exception.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from _mutations import mutate, seeds
from fibgen.compiler import compile_sources
from fibgen.compiler.formatter import format_paths, format_text
from fibgen.pipeline import import_paths

ROOT = Path(__file__).resolve().parents[1]
SEEDS = seeds()

# Note [fuzz budget]: 1,000 derandomized examples of check + fmt take about 20 s on a quiet
# 2-core machine (twice that in the whole suite); the same choices are drawn on every run, so
# a failure here is a failure every time. benchmarks/fuzz_compiler.py runs the mutations a
# hundred thousand times.
FUZZ = settings(
    max_examples=1000,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@st.composite
def mutated_source(draw) -> str:
    """A catalogue family (or small file) under one to four mutations of tests/_mutations.py."""
    text = draw(st.sampled_from(SEEDS))

    def choose(n: int) -> int:
        return draw(st.integers(0, n - 1))

    return mutate(text, choose, SEEDS, draw(st.integers(1, 4)))


def assert_check_and_fmt_hold(text: str) -> None:
    """`fibgen check`: a module or positioned errors; `fibgen fmt`: a fixed point or errors."""
    result = compile_sources([("f.fidef", "f.fidef", text)])
    if result.module is None:
        errors = [d for d in result.diagnostics if d.severity == "error"]
        assert errors
        for d in errors:
            assert d.span is not None and d.span.line >= 1 and d.span.file == "f.fidef", d
    # format_text itself parses what it printed, compares it with the input's IR and prints it
    # again: an "internal error" is fmt changing the meaning, or not being idempotent.
    formatted, diags = format_text(text, "f.fidef")
    assert not [d for d in diags if d.message.startswith("internal error")], text


@pytest.mark.slow
@FUZZ
@given(mutated_source())
def test_check_and_fmt_give_a_result_or_positioned_diagnostics(text: str):
    assert_check_and_fmt_hold(text)


# A family written for these cases, so that they do not change when the catalogue does.
BASE = """\
family rmsnorm {
  op_type rmsnorm
  description "RMS normalization."
  api flashinfer.norm.rmsnorm(input, weight, out=None)

  axes {
    batch_size  : var
    hidden_size : const h
    input_size  : const = 2 * hidden_size
  }

  inputs {
    hidden_states : bfloat16[batch_size, hidden_size] <- input
    weight        : bfloat16[hidden_size]
  }

  outputs {
    output : bfloat16[batch_size, hidden_size] -> out
  }

  reference \"\"\"
    EPS = 1e-6

    def run(hidden_states, weight):
        return hidden_states
  \"\"\"

  instances {
    h=4096 tags [status:verified]
  }
}
"""


def _with(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


TUPLE = _with("<- input\n", "<- input[0]\n").replace(
    "weight        : bfloat16[hidden_size]", "weight        : bfloat16[hidden_size] <- input[1]"
)

# Inputs that once raised out of `fibgen check` or `fibgen fmt` (issue 14, items 5 to 8 and
# 16, and what the fuzzers found since), each with the first error it must now give.
CRASHES = {
    "integer literal over 4,300 digits": (
        _with("h=4096 ", "h=" + "9" * 5000 + " "),
        "integer literal of 5000 digits is too long",
    ),
    "tuple index over 4,300 digits": (
        TUPLE.replace("<- input[1]", "<- input[" + "9" * 4400 + "]"),
        "integer literal of 4400 digits is too long",
    ),
    "tuple index far past the elements": (
        TUPLE.replace("<- input[1]", "<- input[1000000000000]"),
        "`input[1000000000000]` points past the elements read from `input`",
    ),
    "NUL byte in a string": (
        _with('description "RMS', 'description "\0RMS'),
        "a string cannot hold a NUL byte",
    ),
    "raw carriage return in a string": (
        _with('description "RMS', 'description "\rRMS'),
        "a raw carriage return inside a one-line string",
    ),
    "lone surrogate escape": (
        _with('description "RMS', 'description "\\ud800RMS'),
        "the string holds the lone surrogate '\\ud800', which no UTF-8 file can hold",
    ),
    "invalid escape": (
        _with('description "RMS', 'description "\\N{no such name}RMS'),
        "invalid string: (unicode error)",
    ),
    "derived const `import`": (
        _with("const = 2 * hidden_size", "const = import"),
        "not a Python expression: invalid syntax",
    ),
    "derived const `4n`": (
        _with("const = 2 * hidden_size", "const = 4n"),
        "not a Python expression: invalid decimal literal",
    ),
    "derived const ending in an operator": (
        _with("const = 2 * hidden_size", "const = 4 * hidden_size +"),
        "not a Python expression: invalid syntax",
    ),
    "derived const that would compute for ever": (
        _with("const = 2 * hidden_size", "const = 9**9**9"),
        "`input_size = 9**9**9` has no value: the power is too large",
    ),
    "derived const over 64 bits": (
        _with("const = 2 * hidden_size", "const = 2**63 + hidden_size"),
        "`input_size = 2**63 + hidden_size` gives 9223372036854779904, which does not fit in 64 "
        "bits",
    ),
    "reference with 200 unclosed parentheses": (
        # Exactly 200 with code after them: a MemoryError out of Python's parser.
        _with("    EPS = 1e-6\n", "    EPS = 1e-6\n    x = " + "(" * 200 + "\n"),
        "the reference is not valid Python: too deeply nested for Python's parser",
    ),
    "float literal out of range": (
        _with("h=4096 ", "h=1e999 "),
        "number `1e999` is out of the range of a float",
    ),
    "definition name with path parts": (
        _with("  op_type rmsnorm\n", '  op_type rmsnorm\n  name "../../../x_h{hidden_size}"\n'),
        "name template `../../../x_h{hidden_size}` gives unsafe definition names: the text "
        "contains the path separator '/'",
    ),
    "dispatch without cases": (
        "dispatch d on routing_method_type {\n  # no cases\n}\n",
        "dispatch `d` has no cases",
    ),
    "raw carriage return in an API's parameter list": (
        # Python counts '\r' as a line break: the defaults after it are on "line 2".
        _with("(input, weight, out=None)", "(input, weight,\r out=None, eps=1e-6)"),
        "parameter `eps` of `flashinfer.norm.rmsnorm` is accounted for by nothing",
    ),
    "a rule of 150 additions": (
        # Python parses it; the emitters' tree walkers would run out of stack on it.
        _with(
            "  axes {",
            "  rules {\n    out is None or " + "+".join(["1"] * 150) + " > 0\n  }\n  axes {",
        ),
        "not a Python expression: nested more than 100 levels deep (fibgen's limit)",
    ),
    "lone surrogate in the reason of `ignore`": (
        # Once printed raw by `fibgen fmt`, which then could not read its own output back.
        _with("  axes {", '  rules {\n    ignore out "\\ud800" "why"\n  }\n  axes {'),
        "the reason of `ignore` holds the lone surrogate '\\ud800', which no UTF-8 file can hold",
    ),
    "keyword as a tensor name": (
        _with("    weight        : bfloat16", "    class         : bfloat16"),
        "`class` is a Python keyword and cannot name an input",
    ),
}


def test_the_base_of_the_crash_cases_compiles():
    assert compile_sources([("f.fidef", "f.fidef", BASE)]).module is not None


@pytest.mark.parametrize("case", sorted(CRASHES))
def test_inputs_that_once_crashed_give_diagnostics(case: str):
    text, first_error = CRASHES[case]
    result = compile_sources([("f.fidef", "f.fidef", text)])
    assert result.module is None
    messages = [d.message for d in result.diagnostics if d.severity == "error"]
    assert messages[0].startswith(first_error), messages
    assert_check_and_fmt_hold(text)


# What fmt once moved on every run, or could not print back (issue 14, item 16).
FMT_CASES = {
    "comments alone in emptied blocks": (
        "family f {\n  op_type x\n  params {\n    # lonely\n  }\n  axes {\n    n : var\n  }\n"
        "  inputs {\n    x : float32[n]\n  }\n  outputs {\n    # none\n  }\n}\n"
    ),
    "a comment after an emptied block that follows the reference": (
        "family f {\n  op_type x\n  axes {\n    n : var\n  }\n  inputs {\n    x : float32[n]\n  }\n"
        '  reference """\n    def run(x):\n        return x\n  """\n  instances {  # c\n  }\n}\n'
    ),
    "a trailing comment after an instance's reference": (
        "family f {\n  op_type x\n  axes {\n    n : var\n    h : const h\n  }\n"
        '  inputs {\n    x : float32[n, h]\n  }\n  instances {\n    h=1 reference """\n'
        '      def run(x):\n          return x\n    """  # trailing\n  }\n}\n'
    ),
    "a comment with a brace next to the constraints block": (
        "family f {\n  op_type x\n  axes {\n    n : var\n  }\n  params {\n    # a } brace\n  }\n"
        "  constraints {\n    n > 0\n  }\n  inputs {\n    x : float32[n]\n  }\n}\n"
    ),
    "a string holding a form feed and a line separator": (
        'family f {\n  op_type x\n  description "a\x0cb\u2028c"\n  # comment\n'
        "  axes {\n    n : var  # trailing\n  }\n  inputs {\n    x : float32[n]\n  }\n}\n"
    ),
}


EMPTY_STRINGS = {
    "empty axis description": _with("batch_size  : var", 'batch_size  : var ""'),
    "empty ignore reason": _with("  axes {", '  rules {\n    ignore out ""\n  }\n  axes {'),
}


@pytest.mark.parametrize("case", sorted(EMPTY_STRINGS))
def test_fmt_keeps_an_empty_string(case: str):
    # An empty description is still one ("description": "" in the JSON): fmt once printed it
    # as none, and then refused the file rather than change its meaning.
    text, diagnostics = format_text(EMPTY_STRINGS[case], "t.fidef")
    assert diagnostics == [] and text is not None and '""' in text


@pytest.mark.parametrize("case", sorted(FMT_CASES))
def test_fmt_is_a_fixed_point_after_one_run(case: str, tmp_path):
    path = tmp_path / "f.fidef"
    path.write_text(FMT_CASES[case], encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert format_paths([str(path)], check=False, out=out, err=err) == 0, err.getvalue()
    once = path.read_text(encoding="utf-8")
    assert format_paths([str(path)], check=True, out=out, err=err) == 0, err.getvalue()
    assert format_paths([str(path)], check=False, out=out, err=err) == 0
    assert path.read_text(encoding="utf-8") == once
    assert once.count("#") == FMT_CASES[case].count("#")  # no comment lost


@pytest.mark.slow
def test_fmt_twice_on_every_catalogue_file_is_fmt_once():
    for path in sorted((ROOT / "definitions").glob("*.fidef")):
        text = path.read_text(encoding="utf-8")
        once, diags = format_text(text, path.name)
        assert once is not None, diags
        assert format_text(once, path.name)[0] == once, path.name


def _definition_json() -> dict:
    return {
        "name": "gemm_n8_k4",
        "op_type": "gemm",
        "description": "A small gemm.",
        "tags": ["status:verified"],
        "axes": {
            "M": {"type": "var"},
            "N": {"type": "const", "value": 8},
            "K": {"type": "const", "value": 4},
        },
        "constraints": ["M > 0"],
        "inputs": {
            "A": {"shape": ["M", "K"], "dtype": "bfloat16"},
            "B": {"shape": ["N", "K"], "dtype": "bfloat16"},
        },
        "outputs": {"C": {"shape": ["M", "N"], "dtype": "bfloat16"}},
        "reference": "def run(A, B):\n    return A @ B.T",
    }


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10),
    st.text(max_size=6),
    st.lists(st.text(max_size=3), max_size=2),
    st.just({}),
)


@st.composite
def mutated_json(draw) -> str:
    obj = _definition_json()
    for _ in range(draw(st.integers(1, 3))):
        path = [obj]
        node = obj
        while isinstance(node, dict) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node)))
            path.append(key)
            node = node[key]
        parent = obj
        for key in path[1:-1]:
            parent = parent[key]
        if len(path) > 1:
            action = draw(st.sampled_from(["delete", "replace"]))
            if action == "delete":
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(JSON_VALUES)
    text = json.dumps(obj)
    if draw(st.booleans()):
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.sampled_from(['"', "}", ",", "", "x"])) + text[pos:]
    return text


@pytest.mark.slow
@settings(
    max_examples=250,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(mutated_json())
def test_import_succeeds_or_fails_cleanly(tmp_path_factory, text: str):
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "in.json").write_text(text)
    out, err = io.StringIO(), io.StringIO()
    code = import_paths([str(tmp / "in.json")], tmp / "out", force=False, out=out, err=err)
    assert code in (0, 1)
    if code == 1:
        assert err.getvalue().startswith("error:")
        assert not (tmp / "out").exists()
    else:
        assert list((tmp / "out").glob("*.fidef"))
