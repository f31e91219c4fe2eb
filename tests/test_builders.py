"""Builders of cpp/cuda solutions: one build across processes, compile errors, launcher checks.

The launcher checks run on the CPU: the generated launcher of rmsnorm_h4096 is compiled with
``FIBGEN_CHECKS_ONLY`` as a cpp solution (the checks alone, no CUDA), so every check before
the device's can be called with CPU tensors. That one build (about a minute with torch's
headers) serves every test here that needs a working extension.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import fibgen.runtime as rt
from fake_flashinfer.catalogue import generated_package
from fibgen.codegen.cuda.emit import scaffold_sources
from fibgen.compiler import compile_paths
from fibgen.format.jsonio import load_solution
from fibgen.format.models import Solution
from fibgen.runtime.solutions import builders

PACKAGE_ROOT = Path(generated_package().__file__).parents[1]
REPO = Path(__file__).resolve().parents[1]

from fake_kernels import rmsnorm  # noqa: E402  (generated above)

# Slow as a whole: compiles C++ solutions.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("c++") is None and shutil.which("g++") is None,
        reason="building cpp solutions needs a C++ compiler (c++ or g++) on PATH",
    ),
]

NAME = "rmsnorm_h4096"


def _solution(name: str, sources: dict[str, str], entry: str, dps: bool = True) -> dict:
    return {
        "name": name,
        "definition": NAME,
        "author": "tests",
        "spec": {
            "language": "cpp",
            "target_hardware": ["cpu"],
            "entry_point": entry,
            "destination_passing_style": dps,
            "binding": "torch",
        },
        "sources": [{"path": p, "content": c} for p, c in sources.items()],
    }


def _checks_only_solution() -> dict:
    result = compile_paths([str(REPO / "definitions" / "norm.fidef")])
    assert result.module is not None
    defn = next(d for d in result.module.definitions if d.name == NAME)
    family = next(f for f in result.module.families() if f.name == defn.family)
    sources = scaffold_sources(defn, family, entry="run", dps=True)
    # The launcher, included by a .cpp that asks for the checks alone, builds with g++.
    launcher = sources.pop(f"{NAME}.cu")
    sources.pop(f"{NAME}.cuh")
    sources.pop("fibgen_kernel.h")
    sources["launcher.inc"] = launcher
    sources["checks_only.cpp"] = '#define FIBGEN_CHECKS_ONLY\n#include "launcher.inc"\n'
    return _solution("checks_only", sources, "binding.cpp::run")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fibgen-cache")


@pytest.fixture(scope="module")
def checks_only(cache, tmp_path_factory) -> Path:
    """The checks-only solution, built by two processes at once (the first test below)."""
    folder = tmp_path_factory.mktemp("solution")
    path = folder / "solutions" / "tests" / "rmsnorm" / NAME / "checks_only.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_checks_only_solution()), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _env(cache, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(cache))
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()


BUILD_ONE = """
import json, sys
from fibgen.format.jsonio import load_solution
from fibgen.runtime.solutions.builders import build_solution
fn, built = build_solution(load_solution(sys.argv[1]))
print(json.dumps({"built": built, "callable": callable(fn)}))
"""


def test_two_processes_build_once(checks_only, cache):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_ONE, str(checks_only)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**_environ(), "FIBGEN_CACHE_DIR": str(cache)},
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["built"] for r in results) == [False, True]
    assert all(r["callable"] for r in results)
    assert len([p for p in (cache / "builds").iterdir() if p.is_dir()]) == 1


def _environ() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ":".join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def test_destination_passing_flag_is_part_of_the_hash(checks_only):
    solution = json.loads(checks_only.read_text(encoding="utf-8"))
    dps = builders.solution_digest(Solution.model_validate(solution))
    solution["spec"]["destination_passing_style"] = False
    assert builders.solution_digest(Solution.model_validate(solution)) != dps


def _call(checks_only, *tensors):
    with rt.enable_apply({NAME: str(checks_only)}, strict=True):
        return rmsnorm.rmsnorm(*tensors)


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            lambda: (_bf16(2, 4096), _bf16(4095)),
            ValueError,
            "rmsnorm_h4096: weight has size 4095 along axis hidden_size (dim 0), expected 4096",
        ),
        (
            lambda: (_bf16(2, 4096), torch.randn(4096)),
            TypeError,
            "rmsnorm_h4096: weight has dtype float32, expected bfloat16",
        ),
        (
            lambda: (_bf16(4096), _bf16(4096)),
            ValueError,
            "rmsnorm_h4096: hidden_states has 1 dimensions, expected 2 [batch_size, hidden_size]",
        ),
        (
            lambda: (_bf16(4096, 2).t(), _bf16(4096)),
            ValueError,
            "rmsnorm_h4096: hidden_states is not contiguous",
        ),
        (
            lambda: (_bf16(2, 4096), _bf16(4096)),
            RuntimeError,
            "rmsnorm_h4096: hidden_states is on cpu, expected a CUDA device",
        ),
    ],
)
def test_launcher_checks_name_the_tensor_and_axis(checks_only, args, error, message):
    fn, _ = builders.build_solution(load_solution(checks_only))
    with pytest.raises(error) as info:
        fn(*args(), _bf16(2, 4096))
    assert str(info.value).startswith(message)


def test_a_failed_check_through_the_dispatcher_is_a_counted_error(checks_only):
    # Through the catalogue's dispatcher, whose bf16 definition the launcher is built for.
    # The dispatcher checks dtypes, ranks and sizes; the launcher also checks layouts.
    from fibgen_kernels.rmsnorm import rmsnorm as dispatcher

    transposed = _bf16(4096, 2).t()  # [2, 4096], not contiguous
    with rt.enable_apply({NAME: str(checks_only)}, patch=False, strict=True):
        with pytest.raises(rt.SolutionError) as info:
            dispatcher(transposed, _bf16(4096), 1e-5)
    assert isinstance(info.value.__cause__, ValueError)
    assert "rmsnorm_h4096: hidden_states is not contiguous" in str(info.value)
    assert rt.stats()["flashinfer.norm.rmsnorm"]["error"] == 1


def test_var_axis_mismatch_names_where_the_size_came_from(checks_only):
    fn, _ = builders.build_solution(load_solution(checks_only))
    with pytest.raises(ValueError) as info:
        fn(_bf16(2, 4096), _bf16(4096), _bf16(3, 4096))
    assert str(info.value).startswith(
        "rmsnorm_h4096: output has size 3 along axis batch_size (dim 0), "
        "expected 2 as in hidden_states (dim 0)"
    )


def test_compile_error_names_the_solution_and_is_counted(tmp_path):
    broken = _solution(
        "broken", {"main.cpp": "int run() { return undeclared_name; }\n"}, "main.cpp::run"
    )
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken), encoding="utf-8")
    with rt.enable_apply({NAME: str(path)}, strict=True):
        with pytest.raises(rt.SolutionError) as info:
            rmsnorm.rmsnorm(_bf16(1, 4096), _bf16(4096))
    message = str(info.value)
    assert "solution 'broken' failed to compile" in message
    assert "main.cpp:1:" in message and "undeclared_name" in message
    assert "ninja" not in message and str(tmp_path) not in message.split("compile:")[1]
    assert rt.stats()["fake_flashinfer.norm.rmsnorm"]["error"] == 1


def test_compile_errors_of_a_solution_folder_name_its_files(tmp_path):
    # The folder's files are what its author edits (Note [source names] in solutions.py).
    folder = tmp_path / "solutions" / "tests" / "rmsnorm" / NAME / "broken"
    folder.mkdir(parents=True)
    source = "int run() { return undeclared_name; }\n"
    (folder / "main.cpp").write_text(source, encoding="utf-8")
    broken = _solution("broken", {"main.cpp": source}, "main.cpp::run")
    (folder / "broken.json").write_text(json.dumps(broken), encoding="utf-8")
    messages = []
    for _ in range(2):  # the second time in a process as the first (no build is left)
        with rt.enable_apply(tmp_path, strict=True):
            with pytest.raises(rt.SolutionError) as info:
                rmsnorm.rmsnorm(_bf16(1, 4096), _bf16(4096))
        messages.append(str(info.value).split("compile:")[1])
    assert messages[0] == messages[1]
    assert f"{folder}/main.cpp:1:" in messages[0] and "undeclared_name" in messages[0]
    assert str(tmp_path / "cache") not in messages[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"entry_point": "notes.txt::run"}, r"is not a C\+\+/CUDA source"),
    ],
)
def test_unbuildable_specs_are_refused_with_the_reason(tmp_path, change, message):
    solution = _solution("odd", {"main.cpp": "//\n", "notes.txt": "-\n"}, "main.cpp::run")
    solution["spec"].update(change)
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(solution), encoding="utf-8")
    with pytest.raises(builders.BuildError, match=message):
        builders.build_solution(load_solution(path))


def test_builders_import_no_compiler_lark_or_jinja():
    code = (
        "import sys; import fibgen.runtime.solutions.builders; "
        "bad = [m for m in ('lark', 'jinja2', 'fibgen.compiler') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_environ())


# A module of Python's C API, not pybind11's: the test is about what is hashed, and this
# compiles in a fraction of the time (the checks-only build above loads a pybind11 module).
TINY = """
#include <Python.h>
#include "tiny.h"
#define FIBGEN_CAT(a, b) a##b
#define FIBGEN_INIT(name) FIBGEN_CAT(PyInit_, name)
#define FIBGEN_STR2(name) #name
#define FIBGEN_STR(name) FIBGEN_STR2(name)
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, nullptr}, {}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, FIBGEN_STR(TORCH_EXTENSION_NAME), nullptr,
                             -1, methods};
PyMODINIT_FUNC FIBGEN_INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
"""


def test_build_extension_hashes_its_headers(tmp_path):
    (tmp_path / "tiny.cpp").write_text(TINY, encoding="utf-8")
    header = tmp_path / "tiny.h"
    header.write_text("#define ANSWER 41\n", encoding="utf-8")
    first = builders.build_extension(
        "tiny", [tmp_path / "tiny.cpp"], include_dirs=[tmp_path], cuda=False
    )
    header.write_text("#define ANSWER 42\n", encoding="utf-8")
    second = builders.build_extension(
        "tiny", [tmp_path / "tiny.cpp"], include_dirs=[tmp_path], cuda=False
    )
    assert (first.answer(), second.answer()) == (41, 42)
