"""The built-in catalogue: it covers the whole dataset, exactly, and stays compact."""

from __future__ import annotations

import json
from pathlib import Path


from _shared import require_shared

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / "generated" / "definitions"


def _contract(d: dict) -> dict:
    # What must agree with the dataset; descriptions and references are our own.
    return {
        "name": d["name"],
        "op_type": d["op_type"],
        "axes": [(k, a["type"], a.get("value")) for k, a in d["axes"].items()],
        "constraints": list(d.get("constraints", [])),
        "inputs": [
            (k, t["shape"], t["dtype"], t.get("optional", False)) for k, t in d["inputs"].items()
        ],
        "outputs": [(k, t["shape"], t["dtype"]) for k, t in d["outputs"].items()],
        "tags": list(d["tags"]),
    }


def _built() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in BUILT.glob("*/*.json")}


def test_every_dataset_definition_is_built_exactly():
    root = require_shared("flashinfer-trace", "definitions")
    built = _built()
    sources = sorted(root.glob("*/*.json"))
    assert len(sources) == 156
    missing, different = [], []
    for path in sources:
        theirs = json.loads(path.read_text())
        ours = built.get(theirs["name"])
        if ours is None:
            missing.append(theirs["name"])
        elif _contract(ours) != _contract(theirs):
            different.append(theirs["name"])
    assert not missing, f"not in the catalogue: {missing}"
    assert not different, f"built differently from the dataset: {different}"


def test_catalogue_is_at_most_a_quarter_of_its_json():
    fidef = sum(len(p.read_text().splitlines()) for p in (ROOT / "definitions").glob("*.fidef"))
    json_lines = sum(len(p.read_text().splitlines()) for p in BUILT.glob("*/*.json"))
    assert json_lines > 0
    assert fidef <= json_lines / 4, f"{fidef} .fidef lines for {json_lines} JSON lines"


def test_catalogue_has_the_families_the_dataset_lacks():
    names = {d["name"].split("_h")[0] for d in _built().values()}
    for family in (
        "silu_and_mul",
        "gelu_and_mul",
        "layernorm",
        "gemma_rmsnorm",
        "append_paged_kv_cache",
        "merge_state",
    ):
        assert any(n.startswith(family) for n in names), family
