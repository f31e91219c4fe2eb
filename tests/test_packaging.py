"""fibgen installed from its wheel, used in a folder of one's own, away from the checkout.

The wheel is installed into a fresh virtual environment that sees this environment's
packages (torch, lark, pydantic, ...) through a path file, and not this checkout: so the
test depends on nothing but the environment the tests already run in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from _shared import require_flashinfer_bench

# Slow as a whole: builds the wheel and installs it in a fresh environment.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)

FIDEF = """\
family scale {
  op_type scale
  axes {
    n : var
    d : const d
  }
  inputs {
    x : float32[n, d]
  }
  outputs {
    y : float32[n, d]
  }
  reference \"\"\"
    def run(x):
        return x * 2
  \"\"\"
  instances {
    d=8
  }
}
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtual environment holding fibgen's wheel; returns its bin/ folder."""
    base = tmp_path_factory.mktemp("installed")
    wheels = base / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        cwd=base,
    )
    assert build.returncode == 0, build.stderr
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # This environment's packages, as plain paths: their own .pth files (the editable
    # install of this checkout among them) are not processed, so fibgen comes from the wheel.
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(site, "parent-environment.pth").write_text("\n".join(ours) + "\n")
    (wheel,) = wheels.glob("fibgen-*.whl")
    # Without PYTHONPATH: a checkout on it holds the fibgen.egg-info the wheel build leaves,
    # which pip would take for fibgen installed already, and install nothing.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["--no-index", str(wheel)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert install.returncode == 0, install.stderr
    return env_dir / "bin"


def _run(bin_dir: Path, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FIBGEN_SOLUTIONS")}
    environ.update(PATH=f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}", **env)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=environ)


def test_wheel_install_builds_outside_the_checkout(installed, tmp_path):
    work = tmp_path / "work"
    (work / "defs").mkdir(parents=True)
    (work / "defs" / "scale.fidef").write_text(FIDEF)
    proc = _run(installed, ["fibgen", "build", "defs", "-o", "out"], work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "out" / "definitions" / "scale" / "scale_d8.json").is_file()
    # A folder of one's own gets a package of its own, which cannot hide the catalogue's.
    assert sorted(p.name for p in (work / "out" / "python").iterdir()) == ["defs_kernels"]
    for command in (["fibgen", "--version"], ["python", "-m", "fibgen", "--version"]):
        proc = _run(installed, command, work)
        assert (proc.returncode, proc.stdout) == (0, f"fibgen {VERSION}\n"), proc.stderr
    # The grammar and the catalogue came from the installed package, not from this checkout.
    where = _run(
        installed,
        ["python", "-c", "from fibgen import paths; print(paths.grammars_dir()); "
         "print(paths.definitions_dir()); print(paths.catalogue_root())"],
        work,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    for line in where.stdout.splitlines():
        assert str(ROOT) not in line and "site-packages" in line, line
    demo = _run(installed, ["python", "-m", "fibgen.demo"], work)
    assert demo.returncode == 0, demo.stderr


def test_the_wheel_ships_the_catalogue(installed, tmp_path):
    code = (
        "from fibgen import paths\n"
        "print(len(list(paths.definitions_dir().glob('*.fidef'))))\n"
        "print(len(list((paths.catalogue_root() / 'definitions').glob('*/*.json'))))\n"
        "print(len(list((paths.catalogue_root() / 'definitions').glob('*/*.fibgen'))))\n"
    )
    proc = _run(installed, ["python", "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr
    fidef, definitions, sidecars = map(int, proc.stdout.split())
    assert fidef == len(list((ROOT / "definitions").glob("*.fidef")))
    assert definitions == len(list((ROOT / "generated" / "definitions").glob("*/*.json")))
    assert sidecars == len(list((ROOT / "generated" / "definitions").glob("*/*.fibgen")))


APPLY = """
import json, sys, torch
import fibgen.runtime as rt
from fibgen_kernels.rmsnorm import rmsnorm
x, w = torch.randn(3, 128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)
with rt.enable_apply(".", patch=False):
    y = rmsnorm(x, w, eps=1e-6)  # rmsnorm_h128's epsilon
    counts = rt.stats()
ref = (x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6) * w.float())
print(json.dumps({"stats": counts, "diff": (y.float() - ref).abs().max().item()}))
"""

LOAD = """
import json
from flashinfer_bench import TraceSet
ts = TraceSet.from_path(".")
print(json.dumps({
    "definitions": sorted(ts.definitions),
    "solutions": sorted(s.name for v in ts.solutions.values() for s in v),
    "workloads": sum(len(v) for v in ts.workloads.values()),
    "traces": sum(len(v) for v in ts.traces.values()),
    "passed": sum(t.evaluation.status.value == "PASSED" for v in ts.traces.values() for t in v),
}))
"""


def test_a_kernel_author_from_scaffold_to_apply_with_the_installed_package(installed, tmp_path):
    """scaffold -> a bug in the source -> bench fails -> repair -> bench passes -> apply routes
    to it -> flashinfer-bench loads the dataset; in a folder of one's own."""
    work = tmp_path / "mine"
    work.mkdir()
    env = {"FIBGEN_CACHE_DIR": str(tmp_path / "cache")}

    def fibgen(*args: str) -> subprocess.CompletedProcess:
        return _run(installed, ["fibgen", *args], work, **env)

    step = fibgen("scaffold-solution", "rmsnorm_h128", "--language", "python", "--author", "me")
    assert step.returncode == 0, step.stderr
    folder = work / "solutions" / "me" / "rmsnorm" / "rmsnorm_h128" / "python_rmsnorm_h128"
    main_py = folder / "main.py"
    good = main_py.read_text()
    step = fibgen("workloads", "rmsnorm_h128", "--axes", "batch_size=3,7")
    assert step.returncode == 0, step.stderr
    assert (work / "definitions" / "rmsnorm" / "rmsnorm_h128.json").is_file()

    # A bug in the source: bench runs the file as it is now, and says it failed.
    buggy = good.replace("output.copy_(_output)", "output.copy_(_output * 2)")
    assert buggy != good
    main_py.write_text(buggy)
    step = fibgen("bench", ".", "--devices", "cpu", "--quiet", "--repeat", "3")
    assert step.returncode == 1, step.stdout + step.stderr
    assert step.stdout.splitlines()[-1].startswith(
        "bench: FAILED: 2 of 2 run(s) did not pass (INCORRECT_NUMERICAL 2)"
    )
    # Repaired: bench passes, and the JSON holds the repaired file (packed by bench).
    main_py.write_text(good)
    step = fibgen("bench", ".", "--devices", "cpu", "--quiet", "--repeat", "3")
    assert step.returncode == 0, step.stdout + step.stderr
    assert step.stdout.splitlines()[-1] == "bench: all 2 run(s) PASSED"
    stored = json.loads((folder / "python_rmsnorm_h128.json").read_text())
    assert stored["sources"] == [{"path": "main.py", "content": good}]
    step = fibgen("validate", ".")
    assert step.returncode == 0, step.stdout

    # apply on the dataset routes to the repaired solution.
    step = _run(installed, ["python", "-c", APPLY], work, **env)
    assert step.returncode == 0, step.stderr
    result = json.loads(step.stdout)
    assert result["stats"]["flashinfer.norm.rmsnorm"]["hit"] == 1, result
    assert result["diff"] < 0.05

    # flashinfer-bench 0.1.2 loads everything the author's folder holds.
    require_flashinfer_bench()
    step = _run(installed, ["python", "-c", LOAD], work, **env)
    assert step.returncode == 0, step.stderr
    assert json.loads(step.stdout) == {
        "definitions": ["rmsnorm_h128"],
        "solutions": ["python_rmsnorm_h128"],
        "workloads": 2,
        "traces": 4,
        "passed": 2,
    }


# ---------------------------------------------------------------------------------------
# What the package and its test extra declare


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_importing_the_runtime_warns_about_nothing():
    # torch warns at import in every process when numpy is missing, and numpy is not among
    # torch's own requirements: fibgen declares it, and the import is silent.
    assert "numpy" in _names(_pyproject()["project"]["dependencies"])
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", "import fibgen.runtime"],
        capture_output=True,
        text=True,
        env=environ,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_the_test_extra_holds_what_the_tests_need_and_ci_installs_it():
    test = _names(_pyproject()["project"]["optional-dependencies"]["test"])
    # matplotlib: the plot is tested, not skipped (FIBGEN_REQUIRE_OPTIONAL=1 in CI);
    # setuptools: the wheel above is built without build isolation; ray: `bench --ray`.
    # mypy: CI type-checks fibgen/ after installing it.
    assert {"pytest", "hypothesis", "matplotlib", "setuptools", "ray", "mypy"} <= test
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "-e '.[test]'" in ci
    assert ci.index("-e '.[test]'") < ci.index("python -m mypy") < ci.index("python -m pytest")
