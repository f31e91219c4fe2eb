"""Every committed bad-input fixture gives exactly its expected diagnostics.

Each case is `tests/fixtures/diagnostics/<case>.fidef` (or a folder of files) with the exact
output of `fibgen check` next to it in `<case>.expected`. Regenerate after an intended change
of wording with `python tests/fixtures/diagnostics/regen.py`, and read the diff.
"""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from _shared import require_module

from fibgen.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path("tests/fixtures/diagnostics")
CASES = sorted(
    p.name.removesuffix(".fidef")
    for p in (ROOT / FIXTURES).iterdir()
    if p.suffix == ".fidef" or p.is_dir()
)


def run_check(case: str) -> tuple[int, str]:
    """Run `fibgen check` on a case from the repo root, returning (exit code, stderr)."""
    target = FIXTURES / case if (ROOT / FIXTURES / case).is_dir() else FIXTURES / f"{case}.fidef"
    err, out = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with redirect_stderr(err), redirect_stdout(out):
            code = main(["check", str(target)])
    finally:
        os.chdir(cwd)
    return code, err.getvalue()


def test_there_are_at_least_thirty_distinct_mistakes():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES)
def test_fixture(case: str):
    if case.startswith("unroutable"):
        # `unroutable` paths are checked against FlashInfer's source, where it is installed.
        require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")
    expected = (ROOT / FIXTURES / f"{case}.expected").read_text(encoding="utf-8")
    code, stderr = run_check(case)
    assert stderr == expected
    assert code == (1 if "error:" in expected else 0)
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_every_case_reports_a_position():
    for case in CASES:
        _, stderr = run_check(case)
        assert " --> tests/fixtures/diagnostics/" in stderr, case
