"""Mutated inputs never crash the compiler or the importer, and never leave partial output."""

from __future__ import annotations

import io
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fibgen.compiler import compile_sources
from fibgen.compiler.format import format_text
from fibgen.compiler.importer import import_paths

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [p.read_text() for p in sorted((ROOT / "definitions").glob("*.fidef"))][:4] or [
    "family f {\n  op_type x\n  axes { n : var }\n  inputs { x : float32[n] }\n}\n"
]
FRAGMENTS = [
    "{",
    "}",
    "[",
    "]",
    ":",
    "=",
    "<-",
    "->",
    '"',
    '"""',
    "#",
    ";",
    "\n",
    "var",
    "const",
    "family",
    "gen",
    "(",
    ")",
    "dtype(",
    "optional",
    "scalar",
    "\\",
    "\t",
    "é",
    "0",
    "-1",
]

FUZZ = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def mutated_source(draw) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "duplicate", "swap"]))
        pos = draw(st.integers(0, len(text)))
        if kind == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 40)) :]
        elif kind == "insert":
            piece = draw(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)))
            text = text[:pos] + piece + text[pos:]
        else:
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if kind == "duplicate":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text


@FUZZ
@given(mutated_source())
def test_compiler_gives_a_module_or_positioned_diagnostics(text: str):
    result = compile_sources([("f.fidef", "f.fidef", text)])
    if result.module is None:
        errors = [d for d in result.diagnostics if d.severity == "error"]
        assert errors
        for d in errors:
            assert d.span is not None and d.span.line >= 1 and d.span.file == "f.fidef", d
    formatted, _ = format_text(text, "f.fidef")
    if formatted is not None:
        assert format_text(formatted, "f.fidef")[0] == formatted


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


@FUZZ
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
