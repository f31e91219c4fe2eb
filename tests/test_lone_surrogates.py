"""A lone surrogate in a dataset's JSON (`"\\ud800"`, half of a UTF-16 pair) is no text: every
command that reads the file refuses it the same way, naming the file and the field, where
pack, bench and workloads used to die writing it again and validate said ok (Note [lone
surrogates] in fibgen/format/jsonio.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _bench_dataset import make_dataset
from fibgen.cli import main
from fibgen.format import FormatError
from fibgen.format.jsonio import parse_json

REFUSED = (
    "{}: \\ud800 is half of a UTF-16 surrogate pair, no character: UTF-8 cannot store it, and "
    "flashinfer-bench refuses the file; write the character itself, or both halves of its pair"
)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _with_surrogate(path: Path, key: str) -> None:
    """Set ``key`` of the JSON object at ``path`` to a string holding a lone surrogate."""
    obj = json.loads(path.read_text(encoding="utf-8"))
    obj[key] = "half \ud800 a pair"
    # ASCII JSON spells the surrogate as the escape "\ud800", as such files do.
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def test_the_reader_names_the_field_a_string_of_a_list_or_a_key_included():
    with pytest.raises(FormatError) as caught:
        parse_json('{"sources": [{"path": "a.py", "content": "x\\ud800"}]}', "s.json")
    assert str(caught.value) == "s.json: " + REFUSED.format("sources[0].content")
    with pytest.raises(FormatError) as caught:
        parse_json('{"a": {"k\\udc00": 1}}', "k.json")
    assert str(caught.value).startswith('k.json: a key "k\\udc00": \\udc00 is half of a UTF-16')
    # A pair is one character, and stays.
    assert parse_json('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}


@pytest.mark.slow
def test_pack_bench_validate_and_workloads_refuse_a_solution_alike(tmp_path, capsys):
    root = tmp_path / "ds"
    assert (
        main(
            [
                "scaffold-solution",
                "rmsnorm_h4096",
                "--language",
                "python",
                "-o",
                str(root / "solutions"),
            ]
        )
        == 0
    )
    assert main(["workloads", "rmsnorm_h4096", "--axes", "batch_size=2", "-o", str(root)]) == 0
    (path,) = (root / "solutions").rglob("*.json")
    _with_surrogate(path, "description")
    capsys.readouterr()
    line = f"error: {path}: " + REFUSED.format("description")
    code, out, err = _run(capsys, "pack", str(path.parent))
    assert (code, out, err) == (1, "", line + "\n")
    code, out, err = _run(capsys, "bench", str(root), "--devices", "cpu", "--quiet")
    assert (code, out, err) == (1, "", line + "\n")
    code, out, _ = _run(capsys, "validate", str(root))
    assert code == 1 and f"{path}: " + REFUSED.format("description") in out
    assert "\ud800" not in path.read_text(encoding="utf-8", errors="backslashreplace")


def test_workloads_and_bench_refuse_a_definition_alike(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    (path,) = (root / "definitions").rglob("*.json")
    _with_surrogate(path, "description")
    line = f"error: {path}: " + REFUSED.format("description")
    # Copied into another dataset, the definition would be written again.
    code, out, err = _run(
        capsys,
        "workloads",
        "scale_h64",
        "--axes",
        "n=5",
        "--definitions",
        str(root),
        "-o",
        str(tmp_path / "other"),
    )
    assert (code, out, err) == (1, "", line + "\n")
    assert not (tmp_path / "other").exists()
    code, out, err = _run(capsys, "bench", str(root), "--devices", "cpu", "--quiet")
    assert (code, out, err) == (1, "", line + "\n")


def test_a_workload_line_with_one_is_named_by_its_line(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    (path,) = (root / "workloads").rglob("*.jsonl")
    record = json.loads(path.read_text())
    record["workload"]["uuid"] = "n3"
    text = json.dumps(record).replace('"n3"', '"n3\\ud800"')
    path.write_text(path.read_text() + text + "\n")
    code, out, err = _run(capsys, "bench", str(root), "--devices", "cpu", "--quiet")
    assert (code, out) == (1, "")
    assert err == f"error: {path}:2: " + REFUSED.format("workload.uuid") + "\n"
