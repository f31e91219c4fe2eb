"""`fibgen validate DATASET`: every problem of a dataset at once, in a table, exit 1 on errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fibgen.cli import main
from fibgen.curation.validate import validate_dataset
from fibgen.format import Solution, Trace, append_traces, dump_trace_line, write_solution

from _bench_dataset import DEFINITION, make_dataset, solution
from _shared import require_shared


def _validate(capsys, *args: str) -> tuple[int, str]:
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    assert err == ""
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
