"""`fibgen bench` and `report` on hostile or damaged datasets: stored paths that escape, outputs
that are no tensor or not finite, torn trace lines, a runner that cannot write its traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import _bench_dataset
from _bench_dataset import make_dataset
from fibgen.cli import main
from fibgen.format import Workload, write_workloads
from fibgen.format.dataset import resolve_dataset_path

# Slow as a whole: bench workers on damaged datasets.
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))


def _fibgen(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _bench(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    code, out, err = _fibgen(
        capsys, "bench", str(root), "--devices", "cpu", "--quiet", "--repeat", "3", *args
    )
    return code, out, _without_timing_note(err)


def _without_timing_note(err: str) -> str:
    """``err`` less the note bench adds when timings spread (a busy machine: CI's, at times)."""
    kept, in_note = [], False
    for line in err.splitlines(keepends=True):
        if line.startswith("note: ") and "spread more than" in line:
            in_note = True
        elif not (in_note and line.startswith("  ")):
            in_note = False
            kept.append(line)
    return "".join(kept)


def _stored(uuid: str, path: str) -> Workload:
    return Workload.model_validate(
        {
            "uuid": uuid,
            "axes": {"n": 3},
            "inputs": {
                "x": {"type": "safetensors", "path": path, "tensor_key": "x"},
                "w": {"type": "random"},
            },
        }
    )


# ---------------------------------------------------------------------------------------
# Stored paths are resolved and must stay inside the dataset (issue 14, item 10)


def test_a_symlink_out_of_the_dataset_is_refused_in_one_line(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=())
    outside = tmp_path / "outside"
    outside.mkdir()
    save_file({"x": torch.randn(3, 64)}, str(outside / "x.safetensors"))
    (root / "blob").mkdir()
    (root / "blob" / "link.safetensors").symlink_to(outside / "x.safetensors")
    (root / "blob" / "folder").symlink_to(outside)
    inside = root / "blob" / "real"
    inside.mkdir()
    save_file({"x": torch.randn(3, 64)}, str(inside / "x.safetensors"))
    (root / "blob" / "alias").symlink_to(inside)  # a link that stays inside is fine
    write_workloads(
        root,
        "scale",
        "scale_h64",
        [
            _stored("link", "blob/link.safetensors"),
            _stored("folder", "blob/folder/x.safetensors"),
            _stored("up", "../outside/x.safetensors"),
            _stored("absolute", str(outside / "x.safetensors")),
            _stored("missing", "blob/none.safetensors"),
            _stored("alias", "blob/alias/x.safetensors"),
        ],
    )
    code, out, err = _bench(capsys, root)
    assert code == 1
    prefix = "error: workload {} of scale_h64, input 'x': "
    escape = (
        "dataset path {!r}: {} is a symbolic link to {}, outside the dataset {}; fibgen reads "
        "and writes only inside the dataset"
    )
    relative = "dataset path {!r} must be relative to the dataset root"
    assert err.splitlines() == [
        prefix.format("link")
        + escape.format("blob/link.safetensors", "it", outside / "x.safetensors", root),
        prefix.format("folder")
        + escape.format("blob/folder/x.safetensors", root / "blob" / "folder", outside, root),
        prefix.format("up") + relative.format("../outside/x.safetensors"),
        prefix.format("absolute") + relative.format(str(outside / "x.safetensors")),
        prefix.format("missing") + f"{root}/blob/none.safetensors: safetensors blob not found",
    ]
    assert out.splitlines() == [
        "1 traces written (PASSED 1); 0 already traced, skipped",
        f"  {root}/traces/scale/scale_h64.jsonl",
        f"bench: FAILED: 5 error(s) above; 1 trace(s) written; see `fibgen report {root}`",
    ]
    (line,) = (root / "traces" / "scale" / "scale_h64.jsonl").read_text().splitlines()
    assert json.loads(line)["workload"]["uuid"] == "alias"


def test_resolve_dataset_path_follows_links(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "up").symlink_to(tmp_path)
    (tmp_path / "ds" / "self").symlink_to(tmp_path / "ds")
    assert resolve_dataset_path(tmp_path / "ds", "self/a") == tmp_path / "ds" / "self" / "a"
    with pytest.raises(ValueError, match=f"{tmp_path}/ds/up is a symbolic link to {tmp_path}, "):
        resolve_dataset_path(tmp_path / "ds", "up/elsewhere")
    with pytest.raises(ValueError, match="contains a NUL byte"):
        resolve_dataset_path(tmp_path / "ds", "a\0b")


# ---------------------------------------------------------------------------------------
# None and NaN outputs get the status and errors flashinfer-bench gives (item 11)


def test_a_none_output_is_incorrect_shape_and_a_nan_output_records_nan(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(
        _bench_dataset.SOLUTIONS, "returns_none", ("def run(x, w):\n    return None\n", False)
    )
    monkeypatch.setitem(
        _bench_dataset.SOLUTIONS,
        "all_nan",
        ("import torch\n\ndef run(x, w):\n    return torch.full_like(x, float('nan'))\n", False),
    )
    monkeypatch.setitem(
        _bench_dataset.SOLUTIONS,
        "nan_and_inf",
        (
            "def run(x, w):\n    y = x * w\n    y[0, 0] = float('nan')\n"
            "    y[1, 1] = float('inf')\n    return y\n",
            False,
        ),
    )
    root = make_dataset(tmp_path / "ds", ["returns_none", "all_nan", "nan_and_inf"], sizes=(3,))
    code, _, err = _bench(capsys, root)
    assert code == 1 and err == ""
    lines = (root / "traces" / "scale" / "scale_h64.jsonl").read_text().splitlines()
    evaluations = {t["solution"]: t["evaluation"] for t in map(json.loads, lines)}
    none = evaluations["returns_none"]
    assert none["status"] == "INCORRECT_SHAPE" and "correctness" not in none
    assert none["log"] == (
        "output 'y' is None, expected a tensor of shape [3, 64] and dtype torch.float32"
    )
    nan = evaluations["all_nan"]
    assert nan["status"] == "INCORRECT_NUMERICAL"
    # As flashinfer-bench writes a non-finite error: the string "NaN", not "Infinity".
    assert nan["correctness"] == {"max_absolute_error": "NaN", "max_relative_error": "NaN"}
    assert nan["log"].endswith("(it holds NaN where the reference does not)")
    # An infinity wins over a NaN, as in flashinfer-bench's check.
    both = evaluations["nan_and_inf"]
    assert both["correctness"] == {
        "max_absolute_error": "Infinity",
        "max_relative_error": "Infinity",
    }
    code, out, err = _fibgen(capsys, "report", str(root))
    assert code == 0 and err == "" and "returns_none" in out


# ---------------------------------------------------------------------------------------
# A torn last trace line: dropped by --resume, skipped by report with its file:line (item 13)


def _tear(path: Path) -> bytes:
    """Append the first 120 bytes of the file's first line, as a writer killed mid-line."""
    data = path.read_bytes()
    torn = data.split(b"\n")[0][:120]
    path.write_bytes(data + torn)
    return data


def test_resume_drops_a_torn_last_line_and_says_so_once(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3, 5))
    code, _, _ = _bench(capsys, root, "--solutions", "good_returns")
    assert code == 0
    path = root / "traces" / "scale" / "scale_h64.jsonl"
    whole = _tear(path)
    code, out, err = _bench(capsys, root, "--resume")
    assert code == 0
    assert err.splitlines() == [
        f"note: {path}:3: dropped a torn last line (120 bytes, not JSON): its writer was "
        "stopped before finishing it"
    ]
    assert out.splitlines()[0] == "2 traces written (PASSED 2); 2 already traced, skipped"
    data = path.read_bytes()
    assert data.startswith(whole) and data.endswith(b"\n")
    traces = [json.loads(line) for line in data.decode().splitlines()]
    assert sorted((t["solution"], t["workload"]["uuid"]) for t in traces) == [
        ("good_dps", "n3"),
        ("good_dps", "n5"),
        ("good_returns", "n3"),
        ("good_returns", "n5"),
    ]


def test_resume_drops_a_torn_last_line_when_everything_is_traced(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3, 5))
    assert _bench(capsys, root)[0] == 0
    path = root / "traces" / "scale" / "scale_h64.jsonl"
    whole = _tear(path)
    code, out, err = _bench(capsys, root, "--resume")
    assert code == 0 and path.read_bytes() == whole
    assert err.startswith(f"note: {path}:3: dropped a torn last line (120 bytes, not JSON)")
    assert out.splitlines()[-1] == "bench: nothing run (2 run(s) already traced, skipped)"


def test_report_names_a_bad_line_and_goes_on(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3, 5))
    assert _bench(capsys, root)[0] == 0
    path = root / "traces" / "scale" / "scale_h64.jsonl"
    _tear(path)
    code, out, err = _fibgen(capsys, "report", str(root))
    assert code == 0
    assert err == (
        f"warning: {path}:3: invalid JSON: Unterminated string starting at (column 114); "
        "line skipped\n"
    )
    assert "good_returns  2       0" in out
    # A bad line in the middle too (a file another tool wrote): named, skipped.
    path.write_text(path.read_text().replace("\n", "\n{}\n", 1))
    code, out, err = _fibgen(capsys, "report", str(root), "--format", "json")
    (tables,) = json.loads(out)["definitions"]["scale_h64"]["hardware"].values()
    assert code == 0 and tables["solutions"]
    assert err.splitlines()[0].startswith(f"warning: {path}:2: ")


def test_an_appender_drops_a_torn_last_line_with_a_warning(tmp_path):
    from fibgen.format import FormatWarning
    from fibgen.format.dataset import append_lines_atomic

    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}')  # whole JSON without its newline: kept
    append_lines_atomic(path, ['{"c": 3}'])
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n{"c": 3}\n'
    path.write_bytes(path.read_bytes() + b'{"d": "to')
    with pytest.warns(FormatWarning) as caught:
        append_lines_atomic(path, ['{"e": 5}'])
    assert [str(w.message) for w in caught] == [
        f"{path}:4: dropped a torn last line (9 bytes, not JSON): its writer was stopped "
        "before finishing it"
    ]
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n{"c": 3}\n{"e": 5}\n'


# ---------------------------------------------------------------------------------------
# A runner thread that fails fails the run and says what was lost (item 14)


def test_a_trace_folder_that_cannot_be_written_is_found_before_anything_runs(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3, 5))
    (root / "traces").mkdir()
    (root / "traces" / "scale").write_text("a file where the folder should be\n")
    code, out, err = _bench(capsys, root)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"error: {root}/traces/scale/scale_h64.jsonl: {root}/traces/scale is a file, not a folder"
    ]


def test_traces_that_cannot_be_written_fail_the_run(tmp_path, capsys, monkeypatch):
    from fibgen.bench import runner

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner, "append_traces", full)
    root = make_dataset(tmp_path / "ds", ["good_returns", "good_dps"], sizes=(3, 5))
    code, out, err = _bench(capsys, root)
    assert code == 1
    assert out.splitlines() == [
        "0 traces written (none); 0 already traced, skipped",
        "bench: FAILED: 2 error(s) above; 0 trace(s) written",
    ]
    assert err.splitlines() == [
        f"error: cannot write 2 trace(s) of scale_h64 workload n3 to "
        f"{root}/traces/scale/scale_h64.jsonl: [Errno 28] No space left on device; "
        "their results are lost",
        "error: not run: 2 run(s) of 1 workload(s) after the error(s) above: scale_h64 "
        "workload n5",
    ]


def test_a_failure_inside_the_runner_thread_fails_the_run(tmp_path, capsys, monkeypatch):
    from fibgen.bench import runner

    def broken(*args, **kwargs):
        raise RuntimeError("the runner broke")

    monkeypatch.setattr(runner, "run_group", broken)
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3, 5))
    code, out, err = _bench(capsys, root)
    assert code == 1 and not (root / "traces").exists()
    assert err.splitlines() == [
        "error: device cpu: RuntimeError: the runner broke; not run: 1 run(s) of scale_h64 "
        "workload n3",
        "error: not run: 1 run(s) of 1 workload(s) after the error(s) above: scale_h64 "
        "workload n5",
    ]
    assert out.splitlines()[-1] == "bench: FAILED: 2 error(s) above; 0 trace(s) written"
