"""The adversarial corpus: inputs an attacker or a careless user would try, each with the
exact output it must give (see tests/adversarial/README.md).

Each case is a folder `tests/adversarial/<case>/` with `case.json` (the issue item it comes
from, the input files, the commands to run before, the command under test) and `expected`
(its exit code, stdout and stderr, exactly). Regenerate after an intended change of wording
with `python tests/adversarial/regen.py`, and read the diff.
"""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from fibgen.cli import main
from fibgen.runtime.selection.hardware import device_name

CORPUS = Path(__file__).resolve().parent / "adversarial"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "case.json").is_file())
# The cases whose command starts bench's workers: seconds each.
RUN_BENCH = {"item10_blob_symlinked_out_of_the_dataset", "item11_solution_returns_none"}


def _fibgen(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def run_case(case: str, workdir: Path) -> tuple[str, dict]:
    """Run a case in `workdir`; return its result in the `expected` file's form, and the spec."""
    spec = json.loads((CORPUS / case / "case.json").read_text(encoding="utf-8"))
    for name, text in spec.get("files", {}).items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text, encoding="utf-8", newline="")
    for name, target in spec.get("symlinks", {}).items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).symlink_to(target)
    cwd = os.getcwd()
    cache = os.environ.get("FIBGEN_CACHE_DIR")
    os.chdir(workdir)
    # Solutions that bench runs are materialized in the case's folder, not the user's cache.
    os.environ["FIBGEN_CACHE_DIR"] = str(workdir / ".cache")
    try:
        for before in spec.get("before", []):
            argv, expected = (
                (before, 0) if isinstance(before, list) else (before["argv"], before["exit"])
            )
            code, _, err = _fibgen(argv)
            assert code == expected, f"{case}: `fibgen {' '.join(argv)}` exited {code}: {err}"
        for name, text in spec.get("create_after", {}).items():
            Path(name).write_text(text, encoding="utf-8")
        code, out, err = _fibgen(spec["argv"])
    finally:
        os.chdir(cwd)
        if cache is None:
            del os.environ["FIBGEN_CACHE_DIR"]
        else:
            os.environ["FIBGEN_CACHE_DIR"] = cache
    # What a CPU is called in traces is this machine's model name; the corpus says <cpu>.
    cpu = device_name(torch.device("cpu"))
    out, err = out.replace(cpu, "<cpu>"), err.replace(cpu, "<cpu>")
    return f"exit: {code}\n--- stdout\n{out}--- stderr\n{err}", spec


def _evaluations(path: Path) -> list[list[str]]:
    """[solution, status, log] of each evaluated trace of a trace file (the rest varies)."""
    traces = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [
        [t["solution"], t["evaluation"]["status"], t["evaluation"]["log"]]
        for t in traces
        if t.get("evaluation")
    ]


def test_every_handled_item_of_issue_14_has_a_case():
    items = {json.loads((CORPUS / c / "case.json").read_text())["item"] for c in CASES}
    # 17 (the tracer) and 19 (killing bench) are not commands: tests/test_tracing.py and
    # tests/test_bench_lifetime.py hold them.
    assert {0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18} <= items


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in RUN_BENCH else c for c in CASES]
)
def test_case(case: str, tmp_path: Path):
    got, spec = run_case(case, tmp_path)
    assert got == (CORPUS / case / "expected").read_text(encoding="utf-8")
    assert "Traceback" not in got
    for name in spec.get("absent", []):
        assert not (tmp_path / name).exists(), f"{case}: {name} exists"
    for name, text in spec.get("files_after", {}).items():
        assert (tmp_path / name).read_text(encoding="utf-8") == text, name
    for name, evaluations in spec.get("traces_after", {}).items():
        assert _evaluations(tmp_path / name) == evaluations, name
