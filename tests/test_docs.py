"""The language reference (docs/language.md) and the README say what the compiler does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fibgen.cli import main

REPO = Path(__file__).resolve().parents[1]
LANGUAGE = REPO / "docs" / "language.md"
FIXTURES = REPO / "tests" / "fixtures" / "diagnostics"


def _families(path: Path) -> list[str]:
    """The ```fidef blocks of a page that hold a whole family."""
    blocks = re.findall(r"^```fidef\n(.*?)^```$", path.read_text(encoding="utf-8"), re.M | re.S)
    return [block for block in blocks if block.startswith("family ")]


EXAMPLES = [
    pytest.param(path, text, id=f"{path.name}-{i}")
    for path in (LANGUAGE, REPO / "README.md")
    for i, text in enumerate(_families(path))
]


def test_there_are_whole_families_to_check():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path, text", EXAMPLES)
def test_a_whole_family_of_the_docs_compiles(path, text, tmp_path, capsys):
    source = tmp_path / "example.fidef"
    source.write_text(text, encoding="utf-8")
    code = main(["check", str(source)])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("path, text", EXAMPLES)
def test_a_whole_family_of_the_docs_is_in_canonical_form(path, text, tmp_path, capsys):
    # What the docs show is what `fibgen fmt` writes: numbers included (`1e-6`, not `1e-06`).
    source = tmp_path / "example.fidef"
    source.write_text(text, encoding="utf-8")
    code = main(["fmt", "--check", str(source)])
    assert code == 0, capsys.readouterr().err


def test_the_language_reference_lists_every_diagnostic_fixture():
    text = LANGUAGE.read_text(encoding="utf-8")
    cases = sorted(
        p.name.removesuffix(".fidef")
        for p in FIXTURES.iterdir()
        if p.suffix == ".fidef" or p.is_dir()
    )
    missing = [case for case in cases if f"`{case}`" not in text]
    assert not missing, f"diagnostics that docs/language.md does not list: {missing}"
