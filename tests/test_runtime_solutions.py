"""Solution JSON, dataset folders, environment enabling and the runtime's import layering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import fibgen.runtime as rt
from fake_flashinfer.catalogue import generated_package

PACKAGE_ROOT = Path(generated_package().__file__).parents[1]
TESTS = Path(__file__).parent
REPO = TESTS.parent

from fake_kernels import rmsnorm  # noqa: E402  (generated above)

DOUBLING = "def run(hidden_states, weight):\n    return hidden_states * 2\n"
DPS_PLUS_ONE = (
    "from .helpers import one\n\n\n"
    "def run(hidden_states, weight, output):\n    output.copy_(hidden_states + one())\n"
)


@pytest.fixture(autouse=True)
def _clean(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()


def _solution(definition: str, name: str, sources: dict[str, str], dps: bool = False) -> dict:
    return {
        "name": name,
        "definition": definition,
        "author": "tests",
        "spec": {
            "language": "python",
            "target_hardware": ["cpu"],
            "entry_point": "main.py::run",
            "destination_passing_style": dps,
        },
        "sources": [{"path": p, "content": c} for p, c in sources.items()],
    }


def _write(root: Path, solution: dict, name: str | None = None) -> Path:
    path = root / "solutions" / "tests" / "rmsnorm" / solution["definition"]
    path.mkdir(parents=True, exist_ok=True)
    file = path / f"{name or solution['name']}.json"
    file.write_text(json.dumps(solution), encoding="utf-8")
    return file


def test_python_solution_json_by_path_and_by_folder(tmp_path):
    x, w = torch.randn(2, 4096), torch.randn(4096)
    file = _write(tmp_path, _solution("rmsnorm_h4096", "double", {"main.py": DOUBLING}))
    with rt.enable_apply({"rmsnorm_h4096": str(file)}):
        assert torch.equal(rmsnorm.rmsnorm(x, w), x * 2)
    with rt.enable_apply(tmp_path):
        assert torch.equal(rmsnorm.rmsnorm(x, w), x * 2)
    # Materialized once, under a folder named by the content hash.
    assert len(list((tmp_path / "cache" / "solutions").iterdir())) == 1


def test_destination_passing_json_with_a_relative_import(tmp_path):
    sources = {"main.py": DPS_PLUS_ONE, "helpers.py": "def one():\n    return 1\n"}
    solution = _solution("rmsnorm_h4096", "plus_one", sources, dps=True)
    x, w = torch.randn(2, 4096), torch.randn(4096)
    with rt.enable_apply({"rmsnorm_h4096": str(_write(tmp_path, solution))}):
        assert torch.equal(rmsnorm.rmsnorm(x, w), x + 1)


@pytest.mark.slow
def test_wrong_arity_is_a_strict_error_naming_the_expected_parameters(tmp_path):
    solution = _solution("rmsnorm_h4096", "bad", {"main.py": "def run(x):\n    return x\n"})
    with rt.enable_apply({"rmsnorm_h4096": str(_write(tmp_path, solution))}, strict=True):
        with pytest.raises(rt.SolutionError) as info:
            rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))
    message = str(info.value)
    assert "'bad'" in message and "rmsnorm_h4096" in message
    assert "hidden_states, weight" in message
    assert rt.stats()["fake_flashinfer.norm.rmsnorm"]["error"] == 1


@pytest.mark.slow
def test_missing_entry_symbol_is_a_strict_error(tmp_path):
    solution = _solution("rmsnorm_h4096", "nosym", {"main.py": "def other():\n    pass\n"})
    with rt.enable_apply({"rmsnorm_h4096": str(_write(tmp_path, solution))}, strict=True):
        with pytest.raises(rt.SolutionError, match="defines no function 'run'"):
            rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))


def test_unsafe_source_paths_are_refused(tmp_path):
    solution = _solution("rmsnorm_h4096", "escape", {"main.py": DOUBLING, "../x.py": ""})
    with pytest.raises(rt.ApplyConfigError, match=r"\.\."):
        rt.enable_apply({"rmsnorm_h4096": str(_write(tmp_path, solution))})


def test_duplicate_solutions_in_a_folder_name_both_files(tmp_path):
    first = _write(tmp_path, _solution("rmsnorm_h4096", "a", {"main.py": DOUBLING}))
    second = _write(tmp_path, _solution("rmsnorm_h4096", "b", {"main.py": DOUBLING}))
    with pytest.raises(rt.ApplyConfigError) as info:
        rt.enable_apply(tmp_path)
    assert str(first) in str(info.value) and str(second) in str(info.value)


def test_solution_registered_under_another_definition_is_refused(tmp_path):
    file = _write(tmp_path, _solution("rmsnorm_h2048", "a", {"main.py": DOUBLING}))
    with pytest.raises(rt.ApplyConfigError, match="is for definition 'rmsnorm_h2048'"):
        rt.enable_apply({"rmsnorm_h4096": str(file)})


def test_folder_without_solutions_is_a_clear_error(tmp_path):
    with pytest.raises(rt.ApplyConfigError, match="has no solutions/ folder"):
        rt.enable_apply(tmp_path)


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(REPO), str(TESTS), str(PACKAGE_ROOT)])
    full = {**os.environ, "PYTHONPATH": path, **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, check=False
    )


ENV_CHECK = """
import torch, fibgen.runtime as rt
from fake_kernels import rmsnorm
x = torch.randn(1, 4096)
print(rt.is_enabled(), torch.equal(rmsnorm.rmsnorm(x, torch.randn(4096)), x * 2))
"""


@pytest.mark.slow
def test_environment_enables_apply_at_import(tmp_path):
    _write(tmp_path, _solution("rmsnorm_h4096", "double", {"main.py": DOUBLING}))
    env = {"FIBGEN_APPLY": "1", "FIBGEN_APPLY_PATH": str(tmp_path)}
    done = _python(ENV_CHECK, {**env, "FIBGEN_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "env, expected",
    [
        ({"FIBGEN_APPLY": "1"}, "needs FIBGEN_APPLY_PATH"),
        ({"FIBGEN_APPLY": "yes", "FIBGEN_APPLY_PATH": "/nowhere"}, "must be 0 or 1"),
        ({"FIBGEN_APPLY": "1", "FIBGEN_APPLY_PATH": "/nowhere"}, "/nowhere does not exist"),
    ],
)
def test_bad_environment_warns_and_keeps_apply_off(env, expected):
    done = _python(ENV_CHECK.replace("x * 2", "x * 0"), env)
    assert done.returncode == 0, done.stderr
    assert expected in done.stderr and "apply stays off" in done.stderr
    # Said at the program's import of fibgen.runtime (line 2 of the script), not in fibgen.
    assert "<string>:2: RuntimeWarning: fibgen:" in done.stderr, done.stderr
    assert done.stdout.split()[0] == "False"


LAYERING = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("lark", "jinja2", "pydantic"):
            raise ImportError(f"{name} must not be imported by the runtime")
sys.meta_path.insert(0, Block())
import torch
before = set(sys.modules)
import fibgen.runtime
from fake_kernels import rmsnorm, gqa_paged_decode, moe
bad = [m for m in sys.modules if m.split(".")[0] in ("lark", "jinja2", "pydantic")
       or m.startswith(("fibgen.compiler", "fibgen.codegen"))]
added = {m.split(".")[0] for m in set(sys.modules) - before}
print(bad, sorted(added - set(sys.stdlib_module_names) - {"fibgen", "fake_kernels"}))
"""


@pytest.mark.slow
def test_runtime_and_generated_modules_import_without_compiler_lark_jinja_or_pydantic():
    done = _python(LAYERING, {})
    assert done.returncode == 0, done.stderr
    bad, others = done.stdout.split(" ", 1)
    assert bad == "[]"
    # What keeps the import cheap (about 20 ms on top of torch; benchmarks/dispatch.py times
    # it, as no test may): nothing beyond torch but the standard library and fibgen.
    assert others.strip() == "[]"


# ---------------------------------------------------------------------------------------
# Triton without a GPU (Note [Triton without a GPU] in fibgen/runtime/solutions/loading.py)

TRITON_APPLY = """
import json, sys, warnings
from pathlib import Path
import torch
{prelude}
import fibgen.runtime as rt
from fibgen.format.dataset import read_solution

path = next(Path(sys.argv[1]).glob("fibgen/*/rmsnorm_h128/*/*.json"))
rt.enable_apply({{"rmsnorm_h128": read_solution(path)}}, patch=False)
# Seeded: unseeded, an output above 8 rounds to bfloat16 by up to 0.03, and the largest
# difference crossed the tolerance on some draws.
torch.manual_seed(0)
x, w = torch.randn(2, 128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = rt.apply("rmsnorm_h128", args=(x, w))
# rmsnorm_h128's epsilon (1e-6)
ref = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6) * w.float()
(counts,) = rt.stats().values()
print(json.dumps({{"counts": counts, "warnings": [str(w.message) for w in caught],
                   "diff": float((out.float() - ref).abs().max())}}))
"""


def _triton_apply(tmp_path, prelude: str = "", base: dict | None = None, **env: str) -> dict:
    from _shared import require_module

    require_module("triton", "triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("with a GPU, Triton compiles its kernels")
    environ = {k: v for k, v in (base or os.environ).items() if k != "TRITON_INTERPRET"}
    environ.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")])),
        FIBGEN_CACHE_DIR=str(tmp_path / "cache"),
        **env,
    )
    code = TRITON_APPLY.format(prelude=prelude)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "solutions")],
        capture_output=True,
        text=True,
        env=environ,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_a_triton_solution_applied_without_a_gpu_runs_under_the_interpreter(tmp_path):
    result = _triton_apply(tmp_path)
    assert result["counts"]["hit"] == 1 and result["counts"]["error"] == 0, result
    assert result["diff"] < 0.05
    (message,) = [m for m in result["warnings"] if "interpreter" in m]
    assert "runs under Triton's interpreter, slowly (TRITON_INTERPRET=1; set " in message


@pytest.mark.slow
@pytest.mark.parametrize(
    "prelude, env, why",
    [
        ("import triton", {}, "Triton was imported with its interpreter off, so its kernels"),
        ("", {"TRITON_INTERPRET": "0"}, "TRITON_INTERPRET=0 keeps Triton's interpreter off"),
    ],
    ids=["triton-imported-first", "interpreter-off"],
)
def test_a_triton_solution_that_cannot_run_without_a_gpu_says_what_to_do(
    tmp_path, prelude, env, why
):
    result = _triton_apply(tmp_path, prelude, **env)
    # Not the "0 active drivers" of a compiled kernel: a load failure that says what to do.
    assert result["counts"]["error"] == 1 and result["diff"] < 0.05  # the reference ran
    (message,) = [m for m in result["warnings"] if "failed to load" in m]
    assert why in message and "0 active drivers" not in message


# A Python solution loaded first, as validate --load and a dataset's apply load them.
PYTHON_FIRST = """
import sys
from fibgen.format import Solution
python = Solution.model_validate({{
    "name": "plain", "definition": "rmsnorm_h2048", "author": "tests",
    "spec": {{"language": "python", "target_hardware": ["cpu"], "entry_point": "main.py::run",
              "destination_passing_style": False}},
    "sources": [{{"path": "main.py", "content": {source!r}}}],
}})
rt.enable_apply({{"rmsnorm_h2048": python}}, patch=False)
x, w = torch.randn(2, 2048, dtype=torch.bfloat16), torch.randn(2048, dtype=torch.bfloat16)
rt.apply("rmsnorm_h2048", args=(x, w))
assert rt.stats()["fibgen.runtime.apply('rmsnorm_h2048')"]["hit"] == 1
assert "triton" not in sys.modules, "loading a Python solution imported Triton"
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "source",
    [
        "def run(hidden_states, weight):\n    return hidden_states\n",
        # One that defines no kernel but has Triton at hand: the interpreter is turned on
        # for it as for a Triton solution, before Triton is imported.
        "import triton\n\n\ndef run(hidden_states, weight):\n    return hidden_states\n",
    ],
    ids=["plain", "imports-triton"],
)
def test_a_triton_solution_runs_after_a_python_one_was_loaded(tmp_path, source):
    prelude = "import fibgen.runtime as rt\n" + PYTHON_FIRST.format(source=source)
    if "import triton" in source:
        prelude = prelude.replace('assert "triton" not in', 'assert "triton" in')
    result = _triton_apply(tmp_path, prelude)
    assert result["counts"]["hit"] == 1 and result["counts"]["error"] == 0, result
    assert result["diff"] < 0.05


@pytest.mark.slow
def test_without_triton_a_triton_solution_says_how_to_install_it_and_nothing_else(tmp_path):
    from _shared import without_modules

    result = _triton_apply(tmp_path, base=without_modules(tmp_path / "no_triton", "triton"))
    assert result["counts"]["error"] == 1 and result["diff"] < 0.05  # the reference ran
    # One message: not that the solution runs under the interpreter, then that it cannot.
    assert [m for m in result["warnings"] if "triton" in m.lower()] == [
        "fibgen: solution 'triton_rmsnorm_h128' (given object) for definition 'rmsnorm_h128' "
        "is a Triton solution, and Triton is not installed here: pip install 'fibgen[triton]'; "
        "calls of rmsnorm_h128 fall back"
    ]


def test_messages_name_the_solution_folders_file_not_the_cache(tmp_path):
    # A solution folder's files are what its author edits: a failure names the file and
    # line there, and tracebacks and inspect show its lines (Note [source names]).
    import inspect

    from fibgen.runtime.routing.state import STATE

    folder = tmp_path / "solutions" / "tests" / "rmsnorm" / "rmsnorm_h4096" / "breaks"
    folder.mkdir(parents=True)
    source = (
        "def helper(x):\n    return x.no_such_method()\n\n\n"
        "def run(hidden_states, weight):\n    return helper(hidden_states)\n"
    )
    (folder / "main.py").write_text(source, encoding="utf-8")
    doc = _solution("rmsnorm_h4096", "breaks", {"main.py": source})
    (folder / "breaks.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.warns(RuntimeWarning) as caught:
        with rt.enable_apply(tmp_path, strict=False):
            rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))
            (loaded,) = STATE.loaded.values()
    (message,) = [str(w.message) for w in caught if " raised " in str(w.message)]
    assert message == (
        f"fibgen: solution 'breaks' ({folder}/breaks.json) for definition 'rmsnorm_h4096' "
        "raised AttributeError: 'Tensor' object has no attribute 'no_such_method' "
        f"(in {folder}/main.py, line 2); such calls fall back"
    )
    run = loaded.fn
    assert inspect.getsourcefile(run) == str(folder / "main.py")
    assert inspect.getsource(run) == source[source.index("def run") :]
    # What was imported, even once the file is edited.
    (folder / "main.py").write_text("# edited\n" + source, encoding="utf-8")
    assert inspect.getsourcelines(run)[1] == 5
