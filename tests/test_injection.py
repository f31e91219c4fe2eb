"""Text from a definition never becomes code: build a hostile corpus, import and call it all.

Every string field of a `.fidef` (descriptions, tags, constraints, references, parameter
values) carries payloads that would run a shell command if any generator pasted them into
Python or C++ unescaped: quotes of every kind closing a literal, triple quotes closing a
docstring, newlines starting a statement or ending a comment, a trailing backslash splicing
lines, trigraphs, format braces, NUL and other control characters. The corpus is built with
`fibgen build`; then every generated Python module is imported and called, the generated
tests are run, and the command must never have run (no marker file), while every string
reads back exactly as written. Names, constraints and generation hints cannot carry payloads:
they are refused (`test_names_cannot_carry_code`, `test_constraints_and_hints_cannot_carry_code`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fibgen.cli import main
from fibgen.codegen.cuda import cppliteral
from fibgen.codegen.python import pyliteral
from fibgen.compiler.printer import long_string, quote

REPO = Path(__file__).resolve().parents[1]


def payloads(marker: Path) -> list[str]:
    """Strings that run `touch marker` wherever they are pasted into code unescaped."""
    shell = f"touch {marker}"
    return [
        f'" + __import__("os").system("{shell}") + "',
        f"' + __import__('os').system('{shell}') + '",
        f'"""\n__import__("os").system("{shell}")\n"""',
        f"'''\n__import__('os').system('{shell}')\n'''",
        f"\n__import__('os').system('{shell}')  # a new line of code",
        f"\\\n__import__('os').system('{shell}')",
        "{__import__('os').system('" + shell + "')} {0} {{}} %s ${x}",
        f'*/ system("{shell}"); /* // ??= ??/\n system("{shell}"); ??\' ',
        f'\n#include <cstdlib>\nstatic int pwned = std::system("{shell}");\n',
        "\x00\x01\r\n\t\x0b\x0c\x1b\x7f\u2028\u2029\ufeff\\",
        "é 中 \U0001f600 trailing backslash \\",
    ]


def _corpus(p: list[str]) -> tuple[str, dict[str, object]]:
    """The .fidef text, and what each field must read back as."""
    text = " | ".join(p)
    # Braces spelled another way: the rules block is one token without braces. A constraint
    # holds no string at all (it is the checked expression language, not Python).
    no_braces = text.replace("{", "<").replace("}", ">")
    constraint = "n >= 0"
    reference = f"PAYLOAD = {text!r}\n\n\ndef run(x, w):\n    return x * w\n"
    # A default in an API's parameter list holds no quote or newline (the grammar's limit).
    doubling = "def run(x):\n    return x * 2\n"
    api_default = "".join(ch for ch in no_braces if ch not in "\"'\n\r()\\")
    expect = {
        "reason": "ignored: " + no_braces,  # inside a rules block: no braces either
        "description": "family: " + text,
        "tags": ["status:verified", *p],
        "axis": "axis: " + text,
        "x": "input: " + text,
        "y": "output: " + text,
        "instance": "instance: " + text,
        "constraint": constraint,
        "reference": reference,
        "mode": "param: " + text,
    }
    source = f"""\
family inj {{
  op_type inj
  description {quote(expect["description"])}
  tags [{", ".join(quote(t) for t in expect["tags"])}]

  params {{
    mode
  }}

  axes {{
    n : var {quote(expect["axis"])}
    h : const h
  }}

  constraints {{
    {constraint}
  }}

  inputs {{
    x : float32[n, h] {quote(expect["x"])}
    w : float32[h]
  }}

  outputs {{
    y : float32[n, h] {quote(expect["y"])}
  }}

  reference {long_string(reference, "  ")}

  instances {{
    h=4 mode={quote(expect["mode"])} {quote(expect["instance"])}
  }}
}}

family inj_stub {{
  op_type inj
  axes {{
    n : var
  }}
  constraints {{
    {constraint}
  }}
  inputs {{
    x : float32[n] {quote(expect["x"])}
  }}
  outputs {{
    y : float32[n] {quote(expect["y"])}
  }}
}}

family inj_api {{
  op_type inj
  api inj_pkg.inj_api(x, mode={api_default!r}, out=None, enable_pdl=None)
  rules {{
    mode == {api_default!r} or mode == {no_braces!r}
    ignore enable_pdl {quote(expect["reason"])}
  }}
  axes {{
    n : var
  }}
  inputs {{
    x : float32[n]
  }}
  outputs {{
    y : float32[n] -> out
  }}
  reference {long_string(doubling, "  ")}
}}
"""
    return source, expect


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The corpus, built into out/ (package `inj_kernels`), and its expected strings."""
    root = tmp_path_factory.mktemp("injection")
    marker = root / "PWNED"
    source, expect = _corpus(payloads(marker))
    (root / "src").mkdir()
    (root / "src" / "inj.fidef").write_text(source, encoding="utf-8")
    argv = ["build", str(root / "src"), "-o", str(root / "out"), "--package", "inj_kernels"]
    assert main(argv) == 0
    assert main(argv + ["--check"]) == 0  # byte-stable
    assert not marker.exists()
    return root, marker, expect


def test_definition_json_holds_every_string_exactly(built):
    root, marker, expect = built
    d = json.loads((root / "out/definitions/inj/inj_h4.json").read_text(encoding="utf-8"))
    assert d["description"] == expect["instance"]  # the instance's replaces the family's
    assert d["tags"] == expect["tags"]
    assert d["axes"]["n"]["description"] == expect["axis"]
    assert d["inputs"]["x"]["description"] == expect["x"]
    assert d["outputs"]["y"]["description"] == expect["y"]
    assert d["constraints"] == [expect["constraint"]]
    assert d["reference"] == f"mode = {expect['mode']!r}\n" + expect["reference"]
    stub = json.loads((root / "out/definitions/inj/inj_stub.json").read_text(encoding="utf-8"))
    assert stub["inputs"]["x"]["description"] == expect["x"]
    assert not marker.exists()


def test_reference_modules_run_and_keep_their_text(built):
    root, marker, expect = built
    ref = _load(root / "out/reference/inj/inj_h4.py", "inj_reference")
    assert ref.PAYLOAD == ast.literal_eval(expect["reference"].split("\n")[0][len("PAYLOAD = ") :])
    assert ref.mode == expect["mode"]
    assert torch.equal(ref.run(torch.ones(2, 4), torch.full((4,), 3.0)), torch.full((2, 4), 3.0))
    stub = _load(root / "out/reference/inj/inj_stub.py", "inj_stub_reference")
    with pytest.raises(NotImplementedError, match="^inj_stub has no reference yet$"):
        stub.run(torch.ones(3))
    doc = stub.run.__doc__
    # The docstring reads back as the definition's own text, newlines and all.
    assert f"x: float32[n]: {expect['x']}" in doc
    assert f"y: float32[n]: {expect['y']}" in doc
    assert expect["constraint"] in doc
    assert not marker.exists()


def test_dispatcher_routes_to_the_reference(built):
    root, marker, expect = built
    sys.path.insert(0, str(root / "out/python"))
    try:
        module = importlib.import_module("inj_kernels.inj")
        got = module.inj(torch.ones(2, 4), torch.full((4,), 2.0))
        assert torch.equal(got, torch.full((2, 4), 2.0))
        importlib.import_module("inj_kernels.inj_stub")
        importlib.import_module("inj_kernels.inj_api")
    finally:
        sys.path.remove(str(root / "out/python"))
    assert not marker.exists()


def test_cuda_modules_import_and_call_up_to_the_compiler(built, monkeypatch):
    root, marker, expect = built
    calls = []

    class Extension:
        def run(self, *args):
            calls.append(("run", args))
            return "ran"

        def run_dps(self, *args):
            calls.append(("run_dps", args))

    def build_extension(name, sources, **kwargs):
        calls.append(("build", name, [Path(s).name for s in sources]))
        for s in sources:
            assert Path(s).is_file(), s
        return Extension()

    module = _load(root / "out/cuda/inj_h4/__init__.py", "inj_cuda")
    monkeypatch.setattr(module, "build_extension", build_extension)
    x, w, y = torch.ones(2, 4), torch.ones(4), torch.empty(2, 4)
    assert module.run(x, w) == "ran"
    module.run_dps(x, w, y)
    assert calls[0] == ("build", "inj_h4", ["inj_h4.cu", "binding.cpp"])
    assert [c[0] for c in calls[1:]] == ["run", "run_dps"]
    assert module.__doc__.startswith("CUDA kernel of inj_h4, built")
    stub = _load(root / "out/cuda/inj_stub/__init__.py", "inj_stub_cuda")
    assert stub.run.__doc__.startswith("Return y, like the reference")
    assert not marker.exists()


_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{", ">": "}"}


def _cpp_code(text: str) -> str:
    """C++ text without its comments and literals, read as a C++ compiler with -trigraphs
    reads it: trigraphs replaced, backslash-newlines spliced, then comments and string and
    character literals removed."""
    for k, v in _TRIGRAPHS.items():
        text = text.replace("??" + k, v)
    text = text.replace("\\\n", "")
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
        elif text[i] in "\"'":
            quote, i = text[i], i + 1
            while text[i] != quote:
                assert text[i] != "\n", "a literal runs past the end of its line"
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append("LITERAL")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def test_cpp_files_hold_the_payloads_only_in_comments_and_literals(built):
    root, marker, _ = built
    files = [p for p in (root / "out/cuda").rglob("*") if p.suffix in (".cu", ".cuh", ".cpp", ".h")]
    assert len(files) == 11
    for path in files:
        code = _cpp_code(path.read_text(encoding="utf-8"))
        assert "system" not in code and "pwned" not in code and "__import__" not in code, path
        assert "#include <cstdlib>" not in code, path


@pytest.mark.slow
def test_generated_tests_pass(built):
    root, marker, expect = built
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "out/tests")],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout
    test_module = _load(root / "out/tests/test_inj.py", "inj_generated_test")
    (entry,) = test_module.DEFINITIONS
    assert entry.params == {"mode": expect["mode"]}
    assert not marker.exists()


def test_generated_tests_and_cuda_modules_are_black_formatted(built):
    # Long strings make long lines inside calls: they must still come out as black's.
    from test_build import assert_black_clean

    root, _, _ = built
    assert assert_black_clean(root / "out/tests") == 3
    assert assert_black_clean(root / "out/cuda") == 3


def test_every_generated_python_file_parses_to_no_call_of_system(built):
    # Belt and braces: no generated module calls os.system at module level or in a function.
    root, marker, _ = built
    for path in (root / "out").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr != "system", f"{path}: {ast.unparse(node)}"


def test_names_cannot_carry_code(tmp_path, capsys):
    marker = tmp_path / "PWNED_name"
    name = f'a" + str(__import__("os").system("touch {marker}")) + "_h{{hidden_size}}'
    source = (REPO / "definitions" / "norm.fidef").read_text(encoding="utf-8")
    source = source.replace(
        "family rmsnorm {\n  op_type rmsnorm\n",
        f"family rmsnorm {{\n  name {quote(name)}\n  op_type rmsnorm\n",
    )
    (tmp_path / "norm.fidef").write_text(source, encoding="utf-8")
    assert main(["build", str(tmp_path / "norm.fidef"), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    # Refused where the template is read, with the rule a name keeps.
    assert 'error: name template `a" + str(__import__' in err
    assert "is 1 to 128 letters, digits, '_', '-' or '.'" in err
    assert not (tmp_path / "out").exists()
    assert not marker.exists()


@pytest.mark.parametrize(
    "constraint",
    [
        "len.__self__.__import__('os').system('touch {marker}') == 0",
        "n >= 0 or x.__class__.__init__.__globals__['os'].system('touch {marker}') == 0",
        "n >= 0 or (lambda: __import__('os').system('touch {marker}'))() == 0",
    ],
)
def test_constraints_and_hints_cannot_carry_code(tmp_path, capsys, constraint):
    # `len` and a tensor input were both in scope of the old eval: each led back to builtins.
    marker = tmp_path / "PWNED_expression"
    hint = f"gen value(len.__self__.__import__('os').system('touch {marker}'))"
    source = (
        "family f {\n  op_type f\n  axes {\n    n : var\n  }\n"
        f"  constraints {{\n    {constraint.format(marker=marker)}\n  }}\n"
        f"  inputs {{\n    x : float32[n]\n    s : float32 scalar {hint}\n  }}\n}}\n"
    )
    (tmp_path / "f.fidef").write_text(source, encoding="utf-8")
    argv = ["workloads", "f", "--axes", "n=2", "--definitions", str(tmp_path / "f.fidef")]
    assert main(argv + ["-o", str(tmp_path / "ds")]) == 1
    err = capsys.readouterr().err
    assert err.count("error: ") == 2
    assert "cannot be used in a constraint" in err or "a constraint calls functions" in err
    assert "cannot be used in a generation hint" in err
    assert "Traceback" not in err
    assert not (tmp_path / "ds").exists()
    assert not marker.exists()


# ------------------------------------------------------------------ the escaping functions


CORPUS = payloads(Path("/nonexistent/PWNED")) + ["", "plain", "a\\", "??/", '"', "\ud800"]


@pytest.mark.parametrize("text", CORPUS)
def test_python_literal_docstring_and_comment_read_back(text):
    assert ast.literal_eval(pyliteral.string(text)) == text
    inside = pyliteral.docstring_text(text)
    assert "\n" not in inside
    assert ast.literal_eval(f'"""{inside}"""') == text
    module = ast.parse(f"# {pyliteral.comment(text)}\nx = 1\n")
    assert [type(n) for n in module.body] == [ast.Assign]


def test_a_tensor_named_like_the_cuda_modules_helper_does_not_hide_it(tmp_path, monkeypatch):
    source = (
        "family f {\n  op_type f\n  axes { n : var }\n"
        "  inputs { extension : float32[n] }\n  outputs { y : float32[n] }\n}\n"
    )
    (tmp_path / "f.fidef").write_text(source, encoding="utf-8")
    assert main(["build", str(tmp_path / "f.fidef"), "-o", str(tmp_path / "out")]) == 0
    module = _load(tmp_path / "out/cuda/f/__init__.py", "f_cuda")
    monkeypatch.setattr(module, "build_extension", lambda *a, **k: _Echo())
    assert module.run(extension=3) == ("run", (3,))


class _Echo:
    def run(self, *args):
        return ("run", args)


@pytest.mark.parametrize("name", ["a b", "class", "1x", "x-y", ""])
def test_python_identifiers_are_checked(name):
    from fibgen.codegen.errors import GenerateError

    with pytest.raises(GenerateError):
        pyliteral.identifier(name)


def test_cpp_literals_and_comments_read_back_with_a_real_compiler(tmp_path):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++ or c++) on PATH")
    texts = [t for t in CORPUS if t != "\ud800"]
    lines = ["#include <cstdio>", "#include <cstring>", "int main() {", "  int lines = 0;"]
    for text in texts:
        lines.append(f"  // {cppliteral.comment(text)}")
        lines.append("  lines++;")  # a comment that swallowed this line would show in the count
        lit = cppliteral.string(text)
        lines.append(
            f"  {{ static const char s[] = {lit}; for (size_t i = 0; i + 1 < sizeof s; i++) "
            'std::printf("%02x", (unsigned char)s[i]); std::printf("\\n"); }'
        )
    lines += ['  std::printf("%d\\n", lines);', "  return 0;", "}"]
    (tmp_path / "t.cpp").write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run(
        [compiler, "-std=c++14", "-trigraphs", "-w", "t.cpp", "-o", "t"], cwd=tmp_path, check=True
    )
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True)
    rows = out.stdout.split("\n")
    assert rows[: len(texts)] == [t.encode("utf-8").hex() for t in texts]
    assert rows[len(texts)] == str(len(texts))
