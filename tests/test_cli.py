"""The `fibgen` command as a user meets it: its version, `python -m fibgen`, names looked up
with a did-you-mean, flags checked before torch loads, and what `report --plot`,
`workloads`, `validate` and `import` say where they used to say nothing or a traceback."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from importlib.metadata import version
from pathlib import Path

import pytest

from fibgen.cli import main

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """Run `fibgen` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's own exits
                code = exc.code
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def fibgen(*args: str, cwd: Path, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run `python [python...] -m fibgen args` in a fresh process."""
    return subprocess.run(
        [sys.executable, *python, "-m", "fibgen", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


# ---------------------------------------------------------------------------- the command


@pytest.mark.slow
def test_version_and_python_m_fibgen(tmp_path):
    expected = f"fibgen {version('fibgen')}\n"
    assert cli("--version") == (0, expected, "")
    proc = fibgen("--version", cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, expected, "")
    proc = fibgen("list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rmsnorm_h4096" in proc.stdout


def _imported(stderr: str) -> set[str]:
    """The modules `python -X importtime` says were imported."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


# Commands whose mistakes can be seen on the command line alone: answered before torch loads.
NO_TORCH = [
    *[[command, "--bad-flag"] for command in ("build", "check", "fmt", "import", "list")],
    *[
        [command, "--bad-flag"]
        for command in ("workloads", "scaffold-solution", "pack", "bench", "report", "validate")
    ],
    ["bench", ".", "--timeout", "0"],
    ["bench", ".", "--warmup", "-1"],
    ["bench", ".", "--repeat", "0"],
    ["bench", ".", "--retries", "x"],
    ["bench", ".", "--flush", "cold"],
    ["report", ".", "--format", "html"],
    ["report", ".", "--plot", "out.txt"],
    ["workloads", "rmsnorm_h4096", "--axes", "batch_size"],
    ["workloads", "../x"],
    ["scaffold-solution", "a/b", "--language", "python"],
    ["scaffold-solution", "rmsnorm_h4096", "--language", "rust"],
    ["build", ".", "--package", "import"],
    ["biuld"],
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", NO_TORCH, ids=" ".join)
def test_command_line_mistakes_are_answered_before_torch_is_imported(argv, tmp_path):
    proc = fibgen(*argv, cwd=tmp_path, python=("-X", "importtime"))
    messages = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2, proc.stderr
    assert any("error" in line for line in messages), messages
    assert "Traceback" not in proc.stderr
    imported = _imported(proc.stderr)
    assert "fibgen.cli" in imported  # the measure works
    assert "torch" not in imported, f"`fibgen {' '.join(argv)}` imported torch"


def test_version_and_a_mistyped_definition_import_no_torch(tmp_path):
    proc = fibgen("--version", cwd=tmp_path, python=("-X", "importtime"))
    assert proc.returncode == 0 and "torch" not in _imported(proc.stderr)
    # A name the catalogue lacks is looked up before the inputs are made.
    proc = fibgen("workloads", "rmsnorm_h4069", cwd=tmp_path, python=("-X", "importtime"))
    assert proc.returncode == 1
    assert "did you mean `rmsnorm_h4096`" in proc.stderr
    assert "torch" not in _imported(proc.stderr)


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["biuld", "x"], "invalid choice: 'biuld'; did you mean `build`?"),
        (["report", ".", "--format", "mdd"], "invalid choice: 'mdd'; did you mean `md`?"),
        (["bench", ".", "--flush", "zeros"], "invalid choice: 'zeros'; did you mean `zero`?"),
        (["bench", ".", "--seeed", "1"], "--seeed: did you mean `--seed`?"),
        (["build", "x", "--pakage", "p"], "--pakage: did you mean `--package`?"),
    ],
)
def test_mistyped_choices_and_flags_get_the_closest_names(argv, hint):
    code, out, err = cli(*argv)
    assert code == 2 and out == ""
    assert hint in err


@pytest.mark.parametrize(
    "flag, value, why",
    [
        ("--timeout", "0", "must be a number greater than 0, not 0"),
        ("--timeout", "inf", "must be a number greater than 0, not inf"),
        ("--timeout", "soon", "'soon' is not a number"),
        ("--warmup", "-1", "must be 0 or more, not -1"),
        ("--repeat", "0", "must be 1 or more, not 0"),
        ("--retries", "-2", "must be 0 or more, not -2"),
    ],
)
def test_each_bench_number_is_checked_by_its_own_flag(flag, value, why, tmp_path):
    code, out, err = cli("bench", str(tmp_path), flag, value)
    assert code == 2 and out == ""
    assert f"argument {flag}: {why}" in err


# ------------------------------------------------------------------------------ report


def _traced_dataset(root: Path, speedups: tuple[float, ...] = (0.998, 0.9985)) -> Path:
    """A dataset holding only traces: one solution, one trace per workload."""
    lines = []
    for i, speedup in enumerate(speedups):
        lines.append(
            {
                "definition": "scale_h64",
                "workload": {"uuid": f"w{i}", "axes": {"n": i + 1}, "inputs": {}},
                "solution": "mine",
                "evaluation": {
                    "status": "PASSED",
                    "environment": {"hardware": "some-cpu", "libs": {}},
                    "timestamp": "2024-01-01T00:00:00",
                    "log": "",
                    "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0},
                    "performance": {
                        "latency_ms": 1.0,
                        "reference_latency_ms": speedup,
                        "speedup_factor": speedup,
                    },
                },
            }
        )
    folder = root / "traces" / "scale"
    folder.mkdir(parents=True)
    (folder / "scale_h64.jsonl").write_text("".join(json.dumps(t) + "\n" for t in lines))
    return root


@pytest.mark.parametrize(
    "target, code, message",
    [
        ("out.txt", 2, "--plot out.txt: matplotlib cannot draw a .txt file; end the name with"),
        ("out", 2, "--plot out: matplotlib cannot draw a file name without a suffix"),
        ("notes/x.png", 1, "--plot notes/x.png: notes is a file, not a folder"),
        ("plots", 1, "--plot plots is a folder; give a file name such as plots/x.png"),
    ],
)
def test_a_bad_plot_target_is_refused_before_the_report_is_printed(target, code, message, tmp_path):
    pytest.importorskip("matplotlib")
    _traced_dataset(tmp_path)
    (tmp_path / "notes").write_text("x")
    (tmp_path / "plots").mkdir()
    got, out, err = cli("report", ".", "--plot", target, cwd=tmp_path)
    assert (got, out) == (code, "")
    assert err == f"error: {message}" + err.split(message, 1)[1]


def test_a_plot_into_a_missing_folder_makes_the_folder(tmp_path):
    pytest.importorskip("matplotlib")
    _traced_dataset(tmp_path)
    code, out, err = cli("report", ".", "--plot", "missing/deeper/x.svg", cwd=tmp_path)
    assert code == 0, err
    assert out.startswith("scale_h64 on some-cpu")
    assert err == "wrote missing/deeper/x.svg\n"
    assert (tmp_path / "missing" / "deeper" / "x.svg").read_text().startswith("<?xml")


def test_plot_without_matplotlib_is_a_missing_package_before_the_report(tmp_path):
    _traced_dataset(tmp_path)
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from fibgen.cli import main; sys.exit(main(['report', '.', '--plot', 'x.png']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert (
        proc.stderr
        == "error: --plot needs matplotlib; install it with `pip install 'fibgen[plot]'`\n"
    )


def test_plot_labels_are_plain_numbers(tmp_path):
    """A narrow range of speedups used to be labelled 9.98×10⁻¹."""
    pytest.importorskip("matplotlib")
    from fibgen.bench.report import figure, summarize

    fig = figure(summarize(_traced_dataset(tmp_path)))
    fig.canvas.draw()
    (ax,) = fig.axes
    labels = [t.get_text() for t in [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)]]
    shown = [label for label in labels if label]
    assert shown, labels
    for label in shown:
        float(label)  # a plain number: no TeX, no ×10ⁿ
    assert "0.998" in shown


# ----------------------------------------------------------------- workloads, validate, import


def test_workloads_without_axes_says_what_it_chose(tmp_path):
    code, out, err = cli("workloads", "rmsnorm_h128", "-o", str(tmp_path))
    assert code == 0, err
    written = tmp_path / "workloads" / "rmsnorm" / "rmsnorm_h128.jsonl"
    assert out == f"wrote 1 workload(s) of rmsnorm_h128 to {written}\n"
    (line,) = written.read_text().splitlines()
    value = json.loads(line)["workload"]["axes"]["batch_size"]
    assert err == (
        f"note: no --axes given: wrote the workload at batch_size={value}, the values input "
        "generation derives; --axes batch_size=V1,V2,... chooses\n"
    )
    # Given axes are what was asked for: no note.
    code, _, err = cli("workloads", "rmsnorm_h128", "--axes", "batch_size=3", "-o", str(tmp_path))
    assert code == 0 and err == ""


def test_workloads_default_dataset_is_the_environment_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_DATASET_PATH", str(tmp_path / "ds"))
    code, _, err = cli("workloads", "rmsnorm_h128", "--axes", "batch_size=2", cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / "ds" / "workloads" / "rmsnorm" / "rmsnorm_h128.jsonl").is_file()


def test_validate_counts_each_warning_in_the_table(tmp_path):
    assert cli("workloads", "rmsnorm_h128", "--axes", "batch_size=2", "-o", str(tmp_path))[0] == 0
    path = tmp_path / "definitions" / "rmsnorm" / "rmsnorm_h128.json"
    data = json.loads(path.read_text())
    data["colour"] = "red"  # an unknown key: a warning about this definition
    path.write_text(json.dumps(data))
    (tmp_path / "stray.json").write_text("{}")  # a warning about no definition
    code, out, _ = cli("validate", str(tmp_path))
    assert code == 0
    rows = {
        line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("rms", "("))
    }
    assert rows["rmsnorm_h128"][-2:] == ["0", "1"]
    assert rows["(no"][-2:] == ["0", "1"]
    assert out.rstrip().endswith("validate: ok: 0 error(s), 2 warning(s)")


def test_import_into_a_file_is_refused_and_leaves_it(tmp_path):
    source = tmp_path / "defs"
    source.mkdir()
    (source / "d.json").write_text(
        (ROOT / "generated" / "definitions" / "rmsnorm" / "rmsnorm_h128.json").read_text()
    )
    (tmp_path / "notes.txt").write_text("mine")
    code, out, err = cli("import", str(source), "-o", str(tmp_path / "notes.txt"))
    assert (code, out) == (1, "")
    assert err == (
        f"error: -o {tmp_path / 'notes.txt'} is a file; give the folder to write the .fidef "
        "files in\n"
    )
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_fmt_says_it_rewrites_files():
    code, out, _ = cli("fmt", "--help")
    assert code == 0 and "Rewrite each .fidef file in place" in out
    code, out, _ = cli("--help")
    (line,) = [line for line in out.splitlines() if line.split()[:1] == ["fmt"]]
    assert line.split()[1] == "rewrite"
