"""`fibgen scaffold-solution`: fresh scaffolds pass their generated test; bad input is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fibgen.cli import main
from fibgen.codegen.scaffold import ScaffoldError, scaffold_solution
from fibgen.format.jsonio import load_solution
from fibgen.runtime.checking import testing

ROOT = Path(__file__).resolve().parents[1]
DEFINITIONS = str(ROOT / "definitions")
NORM = str(ROOT / "definitions" / "norm.fidef")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    assert main(["build", NORM, "-o", str(out), "--package", "fibgen_sc_kernels"]) == 0
    return out


def _run_generated_test(built: Path, solutions: Path, definition: str) -> str:
    env = {
        **os.environ,
        "FIBGEN_SOLUTIONS": str(solutions),
        "FIBGEN_CACHE_DIR": str(solutions.parent / "cache"),
        "TRITON_INTERPRET": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
        + ["tests/test_rmsnorm.py", "-k", definition],
        cwd=built,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped" not in proc.stdout, proc.stdout
    return proc.stdout


VARIANTS = [("triton", True), ("triton", False), ("python", True), ("python", False)]


def _author(dps: bool) -> str:
    return "me_dps" if dps else "me_values"


@pytest.fixture(scope="module")
def scaffolded(built, tmp_path_factory):
    """The four scaffolds side by side in one solutions folder, and the output of the family's
    generated test run once over them: it checks every solution it finds (a pytest process
    per scaffold cost four interpreter and Triton starts for the same test)."""
    solutions = tmp_path_factory.mktemp("scaffolds") / "solutions"
    results = {
        (language, dps): scaffold_solution(
            "rmsnorm_h4096",
            language=language,
            author=_author(dps),
            dps=dps,
            output=solutions,
            definitions=DEFINITIONS,
        )
        for language, dps in VARIANTS
    }
    return solutions, results, _run_generated_test(built, solutions, "rmsnorm_h4096")


@pytest.mark.slow
@pytest.mark.parametrize("language, dps", VARIANTS)
def test_fresh_scaffold_passes_its_generated_test(scaffolded, language, dps):
    solutions, results, _ = scaffolded
    result = results[language, dps]
    name = f"{language}_rmsnorm_h4096"
    assert result.folder == solutions / _author(dps) / "rmsnorm" / "rmsnorm_h4096" / name
    solution = load_solution(result.solution_json)
    assert solution.spec.entry_point == "main.py::run"
    assert solution.spec.destination_passing_style is dps
    assert [s.path for s in solution.sources] == ["main.py"]
    main_py = (result.folder / "main.py").read_text()
    assert solution.sources[0].content == main_py
    signature = "hidden_states, weight, output" if dps else "hidden_states, weight"
    assert f"def run({signature}):" in main_py
    if language == "triton":
        assert "@triton.jit" in main_py
    # The generated test, run over the four (the fixture), found this one among them.
    found = testing.find_solutions(solutions, "rmsnorm_h4096")
    assert result.solution_json.resolve() in [p.resolve() for p in found]


@pytest.mark.slow
def test_triton_scaffold_without_a_kernel_says_so(tmp_path):
    result = scaffold_solution(
        "fused_add_rmsnorm_h4096",
        language="triton",
        author="me",
        output=tmp_path,
        definitions=DEFINITIONS,
    )
    text = (result.folder / "main.py").read_text()
    assert "TODO: launch a @triton.jit kernel" in text
    assert "def run(hidden_states, residual, weight, output):" in text


@pytest.mark.slow
def test_cli_writes_and_refuses_to_overwrite(tmp_path, capsys):
    args = ["scaffold-solution", "rmsnorm_h128", "--language", "python", "--author", "me"]
    args += ["-o", str(tmp_path), "--definitions", DEFINITIONS, "--name", "mine"]
    assert main(args) == 0
    folder = tmp_path / "me" / "rmsnorm" / "rmsnorm_h128" / "mine"
    assert sorted(p.name for p in folder.iterdir()) == ["main.py", "mine.json"]
    (folder / "main.py").write_text("# edited\n")
    capsys.readouterr()

    assert main(args) == 1
    err = capsys.readouterr().err
    assert err == f"error: {folder} already exists; pass --force to replace it\n"
    assert (folder / "main.py").read_text() == "# edited\n"

    assert main([*args, "--no-dps", "--force"]) == 0
    assert (folder / "main.py").read_text() != "# edited\n"
    assert (
        json.loads((folder / "mine.json").read_text())["spec"]["destination_passing_style"] is False
    )
    assert sorted(p.name for p in folder.parent.iterdir()) == ["mine"]  # no leftovers


@pytest.mark.slow
def test_a_dataset_root_as_output_is_refused_with_its_solutions_folder(tmp_path, capsys):
    # Written into the dataset's root, the solution would be where neither bench nor apply
    # looks; the message names the folder they read.
    (tmp_path / "workloads").mkdir()
    (tmp_path / "definitions").mkdir()
    args = ["scaffold-solution", "rmsnorm_h128", "--language", "python", "-o", str(tmp_path)]
    assert main([*args, "--definitions", DEFINITIONS]) == 1
    assert capsys.readouterr().err == (
        f"error: {tmp_path} is a dataset (it has definitions/, workloads/); bench and apply "
        f"find its solutions under {tmp_path / 'solutions'}: use -o {tmp_path / 'solutions'}\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["definitions", "workloads"]
    args[-1] = str(tmp_path / "solutions")
    assert main([*args, "--definitions", DEFINITIONS]) == 0


@pytest.mark.slow
def test_unknown_definition_lists_the_closest_names(tmp_path, capsys):
    args = ["scaffold-solution", "rmsnorm_h4069", "--language", "python"]
    assert main([*args, "-o", str(tmp_path), "--definitions", DEFINITIONS]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: no definition named `rmsnorm_h4069` in {DEFINITIONS}\n"
        "  = help: did you mean `rmsnorm_h4096`"
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"language": "rust"}, "unknown language 'rust'"),
        ({"language": "python", "author": "../x"}, "--author '../x' contains the path separator"),
        ({"language": "python", "definitions": "/no/such/dir"}, "does not exist"),
    ],
)
def test_bad_arguments_are_clean_errors(tmp_path, kwargs, message):
    kwargs = {"definitions": DEFINITIONS, "output": tmp_path, **kwargs}
    with pytest.raises(ScaffoldError, match=message):
        scaffold_solution("rmsnorm_h128", **kwargs)
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_cuda_scaffold_lists_every_source(tmp_path):
    pytest.importorskip("fibgen.codegen.cuda.emit").scaffold_sources  # the CUDA target's entry
    result = scaffold_solution(
        "rmsnorm_h4096", language="cuda", author="me", output=tmp_path, definitions=DEFINITIONS
    )
    solution = load_solution(result.solution_json)
    on_disk = sorted(
        str(p.relative_to(result.folder)) for p in result.folder.rglob("*") if p.is_file()
    )
    assert sorted([s.path for s in solution.sources] + [result.solution_json.name]) == on_disk
    entry_file, symbol = solution.spec.entry_point.split("::")
    assert entry_file in on_disk and symbol == "run"


@pytest.mark.slow
def test_pack_writes_an_edited_folder_into_its_json(tmp_path, capsys):
    result = scaffold_solution(
        "rmsnorm_h128", language="python", author="me", output=tmp_path, definitions=DEFINITIONS
    )
    main_py = result.folder / "main.py"
    main_py.write_text(main_py.read_text() + "\n# tuned\n")
    assert main(["pack", "--check", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == f"stale: {result.solution_json}\n"
    assert "1 Solution JSON(s) do not hold their folder's files; run `fibgen pack" in err
    assert main(["pack", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (
        f"packed: {result.solution_json}\n0 of 1 solution(s) already up to date\n"
    )
    assert load_solution(result.solution_json).sources[0].content.endswith("# tuned\n")
    submit = tmp_path / "submit.json"
    assert main(["pack", str(result.folder), "-o", str(submit)]) == 0
    assert load_solution(submit) == load_solution(result.solution_json)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p, "no solution folder in"),
        (lambda p: p / "missing", "no such file or folder"),
    ],
)
def test_pack_refuses_what_is_not_a_solution_folder(tmp_path, capsys, make, message):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["pack", str(make(tmp_path))]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_pack_fills_a_json_whose_sources_are_empty(tmp_path, capsys):
    """Filling `sources` is pack's job: an empty list (or none) in a folder is not an error."""
    result = scaffold_solution(
        "rmsnorm_h128", language="python", author="me", output=tmp_path, definitions=DEFINITIONS
    )
    packed = json.loads(result.solution_json.read_text())
    for emptied in ([], None):
        data = {k: v for k, v in packed.items() if k != "sources"}
        if emptied is not None:
            data["sources"] = emptied
        result.solution_json.write_text(json.dumps(data))
        assert main(["pack", "--check", str(result.folder)]) == 1
        assert capsys.readouterr().out == f"stale: {result.solution_json}\n"
        assert main(["pack", str(result.folder)]) == 0, capsys.readouterr().err
        capsys.readouterr()
        assert json.loads(result.solution_json.read_text()) == packed


def test_compile_errors_of_definitions_are_not_prefixed_twice(tmp_path, capsys):
    (tmp_path / "bad.fidef").write_text(
        "family f {\n  op_type x\n  axes { n : var }\n  inputs { a : float32[m] }\n"
        '  outputs { b : float32[n] }\n  reference """\ndef run(a):\n    return a\n"""\n}\n'
    )
    args = ["scaffold-solution", "f", "--language", "python", "-o", str(tmp_path / "out")]
    assert main([*args, "--definitions", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "error: error:" not in err
    assert err.startswith("error: ") and "unknown axis `m`" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_dataset_as_definitions_scaffolds_what_the_catalogue_does(tmp_path, capsys):
    """`workloads --definitions DATASET` takes a dataset; so does scaffold-solution."""
    dataset = tmp_path / "ds"
    assert main(["workloads", "rmsnorm_h128", "--axes", "batch_size=2", "-o", str(dataset)]) == 0
    args = ["scaffold-solution", "rmsnorm_h128", "--language", "python", "--author", "me"]
    assert main([*args, "-o", str(tmp_path / "a"), "--definitions", str(dataset)]) == 0
    assert main([*args, "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()

    def files(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}

    assert files(tmp_path / "a") == files(tmp_path / "b") != {}
    assert main([*args[:1], "rmsnorm_h129", *args[2:], "--definitions", str(dataset)]) == 1
    assert capsys.readouterr().err == (
        f"error: no definition named `rmsnorm_h129` in {dataset / 'definitions'}\n"
        "  = help: did you mean `rmsnorm_h128`?\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["a/b", "--language", "python"], "DEFINITION 'a/b' contains the path separator"),
        (["x", "--language", "python", "--name", ".hidden"], "--name '.hidden' starts with '.'"),
        (["x", "--language", "pyton"], "invalid choice: 'pyton'; did you mean `python`?"),
    ],
)
def test_names_of_the_wrong_form_are_command_line_errors(tmp_path, capsys, argv, message):
    try:
        code = main(["scaffold-solution", *argv, "-o", str(tmp_path)])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
