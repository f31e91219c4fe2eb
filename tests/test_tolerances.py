"""Tolerances that would pass anything are refused where they are written.

`tolerance(matched=0)` compiled, and a sidecar with `"matched": 0.0` made bench pass a
solution that returns zeros, while `fibgen validate` said the dataset was sound. The
`.fidef` now gets a diagnostic at the value (fixture `tolerance_out_of_range`), and the
sidecar beside a definition JSON is refused by every reader, naming the file: validate
reports it, bench stops before it runs anything.
"""

from __future__ import annotations

import json

import pytest

from _bench_dataset import make_dataset
from fibgen.cli import main
from fibgen.format import FormatError
from fibgen.format.dataset import read_extras
from fibgen.format.tolerances import tolerance_problem


@pytest.mark.parametrize(
    "key, value, problem",
    [
        ("matched", 0, "is not in (0, 1]"),
        ("matched", 0.0, "is not in (0, 1]"),
        ("matched", 1.5, "is not in (0, 1]"),
        ("matched", -0.5, "is not in (0, 1]"),
        ("atol", -1e-3, "is negative"),
        ("rtol", -1, "is negative"),
        ("atol", float("nan"), "is not a finite number"),
        ("rtol", float("inf"), "is not a finite number"),
        ("atol", True, "is not a finite number"),
        ("atol", "1e-2", "is not a finite number"),
    ],
)
def test_a_tolerance_that_passes_anything_or_nothing_is_a_problem(key, value, problem):
    assert tolerance_problem(key, value)[0] == problem


@pytest.mark.parametrize(
    "key, value", [("matched", 1), ("matched", 0.99), ("matched", 1e-6), ("atol", 0), ("rtol", 1)]
)
def test_sound_tolerances_are_no_problem(key, value):
    assert tolerance_problem(key, value) is None


ZEROS = "import torch\n\ndef run(x, w):\n    return torch.zeros_like(x)\n"


def _dataset_passing_zeros(tmp_path):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    solution = root / "solutions" / "tester" / "scale" / "scale_h64" / "good_returns.json"
    doc = json.loads(solution.read_text())
    doc["name"] = "zeros"
    doc["sources"] = [{"path": "main.py", "content": ZEROS}]
    solution.with_name("zeros.json").write_text(json.dumps(doc))
    sidecar = root / "definitions" / "scale" / "scale_h64.fibgen"
    sidecar.write_text(json.dumps({"tolerance": {"matched": 0.0, "atol": -1}}))
    return root, sidecar


def test_a_sidecar_that_would_pass_zeros_is_refused_by_its_reader(tmp_path):
    root, sidecar = _dataset_passing_zeros(tmp_path)
    with pytest.raises(FormatError) as caught:
        read_extras(sidecar.with_suffix(".json"))
    assert str(caught.value) == (
        f"{sidecar}: 2 problems:\n"
        "  - tolerance.matched: 0.0 is not in (0, 1]; matched is the share of elements that "
        "must pass: 1 for all of them, 0.99 for 99%; 0 would pass any output\n"
        "  - tolerance.atol: -1 is negative; atol is the absolute error an element may have: "
        "0 or more"
    )


def test_validate_reports_the_sidecar(tmp_path, capsys):
    root, sidecar = _dataset_passing_zeros(tmp_path)
    assert main(["validate", str(root)]) == 1
    out = capsys.readouterr().out
    assert str(sidecar.relative_to(root)) in out or str(sidecar) in out
    assert "tolerance.matched: 0.0 is not in (0, 1]" in out
    assert "error" in out.splitlines()[-1]


def test_bench_refuses_the_sidecar_before_it_runs_anything(tmp_path, capsys):
    root, sidecar = _dataset_passing_zeros(tmp_path)
    assert main(["bench", str(root), "--devices", "cpu"]) == 1
    err = capsys.readouterr().err
    assert str(sidecar) in err
    assert "tolerance.matched: 0.0 is not in (0, 1]" in err
    assert "Traceback" not in err
    assert not (root / "traces").exists() or not any((root / "traces").rglob("*.jsonl"))


def test_a_null_tolerance_means_the_default(tmp_path):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    sidecar = root / "definitions" / "scale" / "scale_h64.fibgen"
    sidecar.write_text(json.dumps({"tolerance": {"atol": None, "matched": 0.99}}))
    assert read_extras(sidecar.with_suffix(".json"))["tolerance"]["matched"] == 0.99
