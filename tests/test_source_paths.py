"""Solution source paths: control characters are refused in the model, and materializing a
solution never leaves a half-written folder in the cache (issue 14, item 12)."""

from __future__ import annotations

import pathlib

import pytest

from fibgen.format import FormatError
from fibgen.format.jsonio import parse_solution, solution_to_json
from fibgen.format.models import Solution, SourceFile
from fibgen.runtime.solutions import loading as solutions


def _json(path: str) -> dict:
    return {
        "name": "s",
        "definition": "d",
        "author": "a",
        "spec": {
            "language": "python",
            "target_hardware": ["cpu"],
            "entry_point": "main.py::run",
            "destination_passing_style": False,
        },
        "sources": [
            {"path": "main.py", "content": "def run(x):\n    return x\n"},
            {"path": path, "content": "x = 1\n"},
        ],
    }


@pytest.mark.parametrize(
    "path, char",
    [("a\0b.py", "\0"), ("a\nb.py", "\n"), ("\x1b[2Jb.py", "\x1b"), ("a\x7f.py", "\x7f")],
)
def test_a_source_path_with_a_control_character_is_refused(path, char):
    import json

    with pytest.raises(FormatError) as caught:
        parse_solution(json.dumps(_json(path)), "s.json")
    assert str(caught.value) == (
        f"s.json: sources[1].path: source path {path!r} contains the control character "
        f"{char!r}; a source path is printable text"
    )


def test_printable_paths_are_still_accepted():
    solution = Solution.model_validate(_json("sub dir/é-ü.py"))
    assert solution.sources[1].path == "sub dir/é-ü.py"


def _leftovers(cache: pathlib.Path) -> list[str]:
    root = cache / "solutions"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_materialize_refuses_a_nul_path_that_skipped_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path))
    solution = Solution.model_validate(_json("ok.py"))
    # Built without validation, as a caller of the runtime may: the runtime checks again.
    bad = solution.model_copy(
        update={
            "sources": [
                solution.sources[0],
                SourceFile.model_construct(path="a\0b.py", content="x = 1\n"),
            ]
        }
    )
    with pytest.raises(ValueError, match=r"contains the control character '\\x00'"):
        solutions.materialize(bad)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("error", [ValueError("embedded null byte"), KeyboardInterrupt()])
def test_materialize_cleans_its_temp_folder_on_any_failure(tmp_path, monkeypatch, error):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path))
    solution = Solution.model_validate(_json("second.py"))
    real = pathlib.Path.write_text
    written = []

    def write_text(self, *args, **kwargs):
        if written:
            raise error
        written.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    with pytest.raises(type(error)):
        solutions.materialize(solution)
    assert written and _leftovers(tmp_path) == []
    monkeypatch.setattr(pathlib.Path, "write_text", real)
    folder, digest = solutions.materialize(solution)
    assert _leftovers(tmp_path) == [digest]
    assert sorted(p.name for p in folder.iterdir()) == ["main.py", "second.py"]
    assert solution_to_json(solution)["sources"][1]["path"] == "second.py"
