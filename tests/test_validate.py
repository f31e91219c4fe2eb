"""`fibgen validate DATASET`: every problem of a dataset at once, in a table, exit 1 on errors."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from fibgen.cli import main
from fibgen.curation.validate import validate_dataset
from fibgen.format import Solution, Trace, append_traces, dump_trace_line, write_solution

from _bench_dataset import DEFINITION, make_dataset, solution, write_runs
from _shared import require_shared


def _validate(capsys, *args: str) -> tuple[int, str]:
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    # Only --load says what it is doing, on stderr, a line at a time.
    assert err == "" if "--load" not in args else err.startswith("validate: checking ")
    return code, out


def test_a_sound_dataset_validates(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3, 17))
    code, out = _validate(capsys, str(root))
    assert code == 0, out
    assert out.splitlines()[-1] == "validate: ok: 0 error(s), 0 warning(s)"
    assert "1 definitions in 1 file(s), 2 solutions in 2 file(s), 2 workloads in 1 file(s)" in out
    row = next(line for line in out.splitlines() if line.startswith("scale_h64"))
    assert row.split() == ["scale_h64", "2", "2", "0", "0", "0", "0"]


def _evaluated(solution_name: str, definition: str = "scale_h64") -> Trace:
    return Trace.model_validate(
        {
            "definition": definition,
            "workload": {"uuid": "n3", "axes": {"n": 3}, "inputs": {}},
            "solution": solution_name,
            "evaluation": {
                "status": "RUNTIME_ERROR",
                "environment": {"hardware": "cpu"},
                "timestamp": "2026-01-01T00:00:00",
            },
        }
    )


def test_every_problem_is_reported_with_where_it_is(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    # Schema: a solution that does not parse, and an unknown key (a warning).
    bad = root / "solutions" / "x" / "bad.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"name": "bad"')
    definition = root / "definitions" / "scale" / "scale_h64.json"
    doc = json.loads(definition.read_text())
    doc["version"] = 2
    definition.write_text(json.dumps(doc))
    # References: a solution of a definition the dataset lacks, a trace of a solution
    # it lacks, a workload of a definition it lacks.
    orphan = solution("good_dps").model_copy(update={"definition": "scale_h128"})
    write_solution(root, orphan, "scale")
    append_traces(root, "scale", [_evaluated("gone")])
    # Layout: a name used twice; a JSON file where readers take JSONL; a workload line in
    # traces/; a stray top-level folder.
    twin = solution("good_returns").model_copy(update={"author": "someone"})
    write_solution(root, twin.model_copy(update={"sources": [*twin.sources]}), "scale")
    (root / "workloads" / "notes.json").write_text("{}")
    workload_line = (root / "workloads" / "scale" / "scale_h64.jsonl").read_text()
    (root / "traces" / "scale" / "extra.jsonl").write_text(workload_line)
    (root / "results").mkdir()
    # A stored input whose blob is not there, and one whose tensor has another shape.
    line = json.loads(workload_line)
    line["workload"]["uuid"] = "blobbed"
    line["workload"]["inputs"]["w"] = {
        "type": "safetensors",
        "path": "blob/workloads/scale/scale_h64/gone.safetensors",
        "tensor_key": "w",
    }
    import torch
    from fibgen.format import save_blob

    rel = save_blob(root, "scale", "scale_h64", "u2", {"x": torch.zeros(5, 64)})
    line2 = json.loads(workload_line)
    line2["workload"]["uuid"] = "shaped"
    line2["workload"]["inputs"]["x"] = {"type": "safetensors", "path": rel, "tensor_key": "x"}
    with open(root / "workloads" / "scale" / "scale_h64.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n" + json.dumps(line2) + "\n")

    code, out = _validate(capsys, str(root))
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith(("error: ", "warning: "))]
    solutions = root / "solutions"
    expected = {
        f"error: {bad}: invalid JSON: Expecting ',' delimiter",
        f"error: {solutions}/tester/scale/scale_h64/good_returns.json: solution name "
        "'good_returns' is also used by "
        f"{solutions}/someone/scale/scale_h64/good_returns.json (flashinfer-bench refuses the "
        "dataset)",
        f"error: {solutions}/tester/scale/scale_h128/good_dps.json: solution 'good_dps' is for "
        "definition 'scale_h128', which the dataset does not have",
        f"error: {root}/traces/scale/extra.jsonl:1: a workload line in traces/ "
        "(flashinfer-bench refuses it): workloads go under workloads/",
        f"error: {root}/traces/scale/scale_h64.jsonl:1: a trace of solution 'gone', which is "
        "not under solutions/",
        f"error: {root}/workloads/scale/scale_h64.jsonl:2: "
        "blob/workloads/scale/scale_h64/gone.safetensors: 1 safetensors input(s) of 1 "
        "workload(s) of scale_h64 refer to blob files that are not in the dataset (the first "
        "is shown; copy the dataset's blob/ folder in)",
        f"error: {root}/workloads/scale/scale_h64.jsonl:3: input 'x': the stored tensor has "
        "shape [5, 64], the workload's axes give [3, 64]",
        f'warning: {definition}: (top level): unknown key "version" ignored '
        "(allowed keys: name, description, op_type, tags, axes, constraints, inputs, outputs, "
        "reference)",
        f"warning: {root}/results: not part of the dataset layout (definitions/, solutions/, "
        "workloads/, traces/, blob/); no reader takes it",
        f"warning: {root}/workloads/notes.json: ignored: the readers of workloads/ take .jsonl "
        "files only",
    }
    missing = [e for e in expected if not any(p.startswith(e) for p in problems)]
    assert not missing, "\n".join(problems)
    assert len(problems) == len(expected), "\n".join(problems)
    assert out.splitlines()[-1] == "validate: FAILED: 7 error(s), 3 warning(s)"


def test_solutions_are_checked_without_running_them(tmp_path):
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    cases = {
        "no_entry": ("def other(x, w):\n    return x\n", "python", "main.py::run"),
        "syntax": ("def run(x, w)\n    return x\n", "python", "main.py::run"),
        "no_export": ("void run() {}\n", "cpp", "main.cpp::run"),
        "rust": ("fn run() {}\n", "tilelang", "main.py::run"),
    }
    for name, (source, language, entry) in cases.items():
        doc = solution("good_returns").model_dump()
        doc.update(name=name)
        doc["spec"].update(language=language, entry_point=entry)
        path = entry.split("::")[0]
        doc["sources"] = [{"path": path, "content": source}]
        from fibgen.format import Solution

        write_solution(root, Solution.model_validate(doc), "scale")
    # A solution folder whose file was edited after its JSON was written.
    folder = root / "solutions" / "me" / "scale" / "scale_h64" / "folder_sol"
    folder.mkdir(parents=True)
    doc = solution("good_returns").model_dump()
    doc["name"] = "folder_sol"
    (folder / "folder_sol.json").write_text(json.dumps(doc))
    (folder / "main.py").write_text("def run(x, w):\n    return x * w * 1\n")
    report = validate_dataset(root)
    found = {(Path(p.where).stem, p.level): p.message for p in report.problems}
    assert found[("no_entry", "error")] == "main.py defines no top-level 'run' (the entry point)"
    assert found[("syntax", "error")].startswith("main.py:1: not valid Python: ")
    assert found[("no_export", "error")] == (
        "no source exports 'run' (the entry point) with TVM_FFI_DLL_EXPORT_TYPED_FUNC"
    )
    assert found[("rust", "error")].startswith("language 'tilelang' is not run by fibgen")
    assert found[("folder_sol", "warning")].startswith(
        "the folder's files differ from the JSON's sources: bench, tests and apply run the files"
    )


def test_load_imports_every_solution(tmp_path):
    root = make_dataset(tmp_path / "ds", ["good_returns", "bad_import"], sizes=(3,))
    assert validate_dataset(root).errors == []
    (problem,) = validate_dataset(root, load=True).errors
    assert "no_such_module_here" in problem.message and problem.definition == "scale_h64"


CUDA_SOURCE = """
#include <tvm/ffi/function.h>
void Scale(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Scale);
"""


def test_load_without_a_gpu_warns_about_a_cuda_solution_instead_of_failing(
    tmp_path, capsys, monkeypatch
):
    # bench says "not run" for a CUDA solution on a CPU; validate --load must not call it an
    # error of the dataset either, but say why it was not loaded and what to do.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TVM_FFI_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    doc = solution("good_dps").model_dump(mode="json")
    doc["name"] = "scale_cu"
    doc["spec"].update(
        language="cuda", target_hardware=["cuda"], entry_point="scale.cu::run", binding=None
    )
    doc["sources"] = [{"path": "scale.cu", "content": CUDA_SOURCE}]
    write_solution(root, Solution.model_validate(doc), "scale")
    code, out = _validate(capsys, str(root), "--load")
    assert code == 0, out
    (line,) = [x for x in out.splitlines() if "not loaded" in x]
    assert line.startswith(f"warning: {root}/solutions/") and "scale_cu.json" in line
    assert "no GPU is visible here; run `fibgen validate --load` on a machine with one, or " in line
    assert 'set TVM_FFI_CUDA_ARCH_LIST (e.g. "9.0" for an H100)' in line


@pytest.mark.slow
def test_the_real_dataset_has_only_its_missing_blobs_to_report():
    # The flashinfer-trace dataset as published here has no blob/ folder: every schema,
    # layout and reference check passes, and the missing blobs are one error per definition.
    report = validate_dataset(require_shared("flashinfer-trace"))
    assert report.records["definitions"] == 156 and report.records["workloads"] > 0
    assert report.warnings == []
    assert report.errors and all("blob files that are not in the dataset" in p.message
                                 for p in report.errors)  # fmt: skip
    assert len(report.errors) == len({p.definition for p in report.errors})


def test_a_folder_that_is_no_dataset_is_an_error(tmp_path, capsys):
    # The command says so in one line, not in a table of nothing; the library in its report.
    (tmp_path / "notes.txt").write_text("x")
    for where, message in [
        (tmp_path, f"{tmp_path} is not a dataset: it has none of definitions/, solutions/"),
        (tmp_path / "missing", f"dataset folder {tmp_path / 'missing'} does not exist"),
        (tmp_path / "notes.txt", f"{tmp_path / 'notes.txt'} is not a folder"),
    ]:
        assert main(["validate", str(where)]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"error: {message}")
    (problem,) = validate_dataset(tmp_path).errors
    assert problem.message.startswith("not a dataset: it has none of definitions/, solutions/")
    (problem,) = validate_dataset(tmp_path / "missing").errors
    assert problem.message == "no such dataset folder"


def test_trace_lines_do_not_need_fibgen_to_be_readable(tmp_path):
    # A trace written by hand in flashinfer-bench's own form passes as it is.
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    trace = _evaluated("good_returns")
    (root / "traces").mkdir()
    (root / "traces" / "scale_h64.jsonl").write_text(dump_trace_line(trace) + "\n")
    assert validate_dataset(root).problems == []
    assert validate_dataset(root).rows[DEFINITION["name"]].traces == 1


def test_a_torn_line_is_an_error_that_says_so_and_the_lines_after_it_are_read(tmp_path, capsys):
    from fibgen.curation.workloads import load_workloads
    from fibgen.format import FormatWarning

    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3, 5))
    path = root / "workloads" / "scale" / "scale_h64.jsonl"
    first, second = path.read_bytes().splitlines()
    # A writer killed 40 bytes into its line, and a record appended after it on its own line.
    path.write_bytes(first + b"\n" + second[:40] + b"\n" + second + b"\n")
    code, out = _validate(capsys, str(root))
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith(("error: ", "warning: "))]
    assert problems == [
        f"error: {path}:2: invalid JSON: Expecting value (column 38): a line torn by a writer "
        "stopped mid-line? fibgen's readers skip it, flashinfer-bench refuses the file; delete "
        "the line"
    ]
    row = next(line for line in out.splitlines() if line.startswith("scale_h64"))
    assert row.split() == ["scale_h64", "1", "2", "0", "0", "0", "0"]
    # What bench reads: the dataset and the file alike skip the torn line, and say where.
    for source in (root, path):
        with pytest.warns(FormatWarning) as caught:
            workloads = load_workloads(source)
        assert [w.uuid for w in workloads["scale_h64"]] == ["n3", "n5"]
        assert [str(w.message) for w in caught] == [
            f"{path}:2: skipped: not JSON (40 bytes; a line torn by a writer stopped before "
            "finishing it?)"
        ]


def _peak(fn) -> int:
    """The most memory Python held at once while ``fn`` ran, in bytes."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_validation_holds_its_findings_not_the_traces(tmp_path):
    # 4 times the runs of the same solutions on the same workloads, the same memory: trace
    # files are read one line at a time.
    names = ["good_returns", "good_dps", "aborts"]
    roots = {runs: make_dataset(tmp_path / f"runs{runs}", names) for runs in (10, 40)}
    assert [write_runs(root, runs) for runs, root in roots.items()] == [120, 480]
    validate_dataset(roots[10])  # imports and first-use caches come before the measurements
    small, large = (_peak(lambda root=root: validate_dataset(root)) for root in roots.values())
    assert large < 1.5 * small, (small, large)
    report = validate_dataset(roots[40])
    assert report.problems == [] and report.records["traces"] == 480
    assert (report.rows["scale_h64"].traces, report.rows["scale_h64"].passed) == (480, 320)


def test_a_problem_on_every_line_is_said_once_with_how_many_lines_have_it(tmp_path, capsys):
    # Note [repeated problems]: what validate holds grows with the distinct problems.
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"])
    assert write_runs(root, 5) == 60  # 20 of them traces of "aborts", which is not there
    path = root / "traces" / "scale" / "scale_h64.jsonl"
    traces = [json.loads(line) for line in path.read_text().splitlines()]
    for trace in traces:  # a key that a newer writer adds to every trace
        trace["evaluation"]["p90_ms"] = 1.0
    path.write_text("".join(json.dumps(trace) + "\n" for trace in traces))
    code, out = _validate(capsys, str(root))
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith(("error: ", "warning: "))]
    assert problems == [
        f"error: {path}:9: a trace of solution 'aborts', which is not under solutions/ (and 19 "
        "more line(s) of this file)",
        f'warning: {path}:1: evaluation: unknown key "p90_ms" ignored (allowed keys: status, '
        "environment, timestamp, log, correctness, performance) (and 59 more line(s) of this "
        "file)",
    ]
    row = next(line for line in out.splitlines() if line.startswith("scale_h64"))
    assert row.split() == ["scale_h64", "2", "2", "60", "40", "20", "60"]
    assert out.splitlines()[-1] == "validate: FAILED: 20 error(s), 60 warning(s)"


# ---------------------------------------------------------------------------------------
# --load runs solutions as bench and apply do (Note [Triton without a GPU], Note [source
# names] in fibgen/runtime/solutions/loading.py)

REPO = Path(__file__).resolve().parent.parent
TRITON_SOLUTION = (
    "solutions/fibgen/rmsnorm/rmsnorm_h128/triton_rmsnorm_h128/triton_rmsnorm_h128.json"
)
PLAIN = "import torch\n\n\ndef run(hidden_states, weight):\n    return hidden_states\n"


def _rmsnorm_dataset(root: Path, python_source: str = PLAIN) -> Path:
    """rmsnorm_h128 and rmsnorm_h2048 with workloads; a Python solution of the second, which
    is loaded first (its author sorts first), and the shipped Triton solution of the first."""
    for name in ("rmsnorm_h128", "rmsnorm_h2048"):
        assert main(["workloads", name, "--axes", "batch_size=2", "-o", str(root)]) == 0
    doc = solution("good_returns").model_dump(mode="json")
    doc.update(name="plain", definition="rmsnorm_h2048", author="a_python")
    doc["sources"] = [{"path": "main.py", "content": python_source}]
    write_solution(root, Solution.model_validate(doc), "rmsnorm")
    target = root / "solutions" / "fibgen" / "rmsnorm" / "rmsnorm_h128" / "triton.json"
    target.parent.mkdir(parents=True)
    target.write_text((REPO / TRITON_SOLUTION).read_text(encoding="utf-8"), encoding="utf-8")
    return root


def _validate_process(tmp_path, root: Path, env: dict | None = None, *args: str):
    import os
    import subprocess
    import sys

    code = "import sys; from fibgen.cli import main; sys.exit(main(sys.argv[1:]))"
    environ = dict(env or os.environ)
    environ.pop("TRITON_INTERPRET", None)
    environ.update(FIBGEN_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, "-c", code, "validate", str(root), *args],
        capture_output=True,
        text=True,
        env=environ,
    )


@pytest.mark.slow
def test_load_runs_a_triton_solution_after_a_python_one_as_bench_does(tmp_path, capsys):
    # Loading the Python solution first must not import Triton with its interpreter off:
    # on a CPU every Triton solution after it would then fail to load.
    import torch

    from _shared import require_module

    require_module("triton", "triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("with a GPU, Triton compiles its kernels")
    root = _rmsnorm_dataset(tmp_path / "ds")
    capsys.readouterr()
    done = _validate_process(tmp_path, root, None, "--load")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "validate: ok: 0 error(s), 0 warning(s)"
    lines = done.stderr.splitlines()
    assert lines[:3] == [
        f"validate: checking {root}; --load imports or builds each solution",
        "validate: importing python solution 'plain' "
        f"({root}/solutions/a_python/rmsnorm/rmsnorm_h2048/plain.json)",
        "validate: importing triton solution 'triton_rmsnorm_h128' "
        f"({root}/solutions/fibgen/rmsnorm/rmsnorm_h128/triton.json)",
    ]
    # What loading it said: Triton's interpreter is on, as in bench's CPU workers.
    assert "runs under Triton's interpreter" in lines[3] and len(lines) == 4


@pytest.mark.slow
def test_load_without_triton_says_how_to_install_it_and_nothing_else(tmp_path, capsys):
    from _shared import without_modules

    root = _rmsnorm_dataset(tmp_path / "ds")
    capsys.readouterr()
    env = without_modules(tmp_path / "no_triton", "triton")
    problems = {}
    for args in ((), ("--load",)):
        done = _validate_process(tmp_path, root, env, *args)
        assert done.returncode == (1 if args else 0), done.stdout + done.stderr
        output = done.stdout + done.stderr
        assert "interpreter" not in output and "No module named" not in output
        problems[args] = [x for x in done.stdout.splitlines() if x.startswith(("error", "warn"))]
    where = f"{root}/solutions/fibgen/rmsnorm/rmsnorm_h128/triton.json"
    assert problems[()] == [
        f"warning: {where}: a triton solution needs Triton, which is not installed: "
        "pip install 'fibgen[triton]'"
    ]
    assert problems[("--load",)] == [
        f"error: {where}: solution 'triton_rmsnorm_h128' for definition 'rmsnorm_h128' is a "
        "Triton solution, and Triton is not installed here: pip install 'fibgen[triton]'"
    ]


def test_load_says_what_it_loads_before_it_loads_it(tmp_path, capsys, monkeypatch):
    # A build takes tens of seconds: each solution is named before its import or build.
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    for name in ("first", "second"):
        doc = solution("good_returns").model_dump(mode="json")
        doc["name"] = name
        doc["sources"][0]["content"] = (
            f"import sys\nprint('{name} is being imported', file=sys.stderr)\n\n\n"
            "def run(x, w):\n    return x * w\n"
        )
        write_solution(root, Solution.model_validate(doc), "scale")
    assert main(["validate", str(root), "--load"]) == 0
    folder = f"{root}/solutions/tester/scale/scale_h64"
    assert capsys.readouterr().err.splitlines() == [
        f"validate: checking {root}; --load imports or builds each solution",
        f"validate: importing python solution 'first' ({folder}/first.json)",
        "first is being imported",
        f"validate: importing python solution 'second' ({folder}/second.json)",
        "second is being imported",
    ]


def test_load_errors_name_the_users_file_not_the_cache(tmp_path, monkeypatch):
    # A Solution JSON's source is named "<json>: <path>", a solution folder's by its file.
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", ["bad_import"], sizes=(3,))
    folder = root / "solutions" / "tester" / "scale" / "scale_h64" / "in_folder"
    folder.mkdir()
    doc = solution("good_returns").model_dump(mode="json")
    doc["name"] = "in_folder"
    doc["sources"][0]["content"] = "import torch\nraise ImportError('not here')\nrun = None\n"
    (folder / "in_folder.json").write_text(json.dumps(doc), encoding="utf-8")
    (folder / "main.py").write_text(doc["sources"][0]["content"], encoding="utf-8")
    found = {Path(p.where).stem: p.message for p in validate_dataset(root, load=True).errors}
    json_file = root / "solutions" / "tester" / "scale" / "scale_h64" / "bad_import.json"
    assert found == {
        "bad_import": "solution 'bad_import' for definition 'scale_h64' failed to load: "
        "ModuleNotFoundError: No module named 'no_such_module_here' "
        f"(in {json_file}: main.py, line 1)",
        "in_folder": "solution 'in_folder' for definition 'scale_h64' failed to load: "
        f"ImportError: not here (in {folder}/main.py, line 2)",
    }
