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

from fibgen.cli import main

CORPUS = Path(__file__).resolve().parent / "adversarial"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "case.json").is_file())


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
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for argv in spec.get("before", []):
            code, _, err = _fibgen(argv)
            assert code == 0, f"{case}: `fibgen {' '.join(argv)}` failed: {err}"
        for name, text in spec.get("create_after", {}).items():
            Path(name).write_text(text, encoding="utf-8")
        code, out, err = _fibgen(spec["argv"])
    finally:
        os.chdir(cwd)
    return f"exit: {code}\n--- stdout\n{out}--- stderr\n{err}", spec


def test_every_handled_item_of_issue_14_has_a_case():
    items = {json.loads((CORPUS / c / "case.json").read_text())["item"] for c in CASES}
    assert {0, 5, 6, 7, 8, 9, 15, 16} <= items


@pytest.mark.parametrize("case", CASES)
def test_case(case: str, tmp_path: Path):
    got, spec = run_case(case, tmp_path)
    assert got == (CORPUS / case / "expected").read_text(encoding="utf-8")
    assert "Traceback" not in got
    for name in spec.get("absent", []):
        assert not (tmp_path / name).exists(), f"{case}: {name} exists"
    for name, text in spec.get("files_after", {}).items():
        assert (tmp_path / name).read_text(encoding="utf-8") == text, name
