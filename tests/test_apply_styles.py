"""Hand-written `apply(name, args)` takes both calling styles, as flashinfer-bench's does."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import fibgen.runtime as rt
from fibgen.format import Solution, write_solution

from _bench_dataset import DEFINITION, make_dataset

NAME = DEFINITION["name"]

DPS = "def run(x, w, y):\n    y.copy_(x * w)\n"
RETURNS = "def run(x, w):\n    return x * w\n"


def _solution(name: str, source: str, dps: bool) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": NAME,
            "author": "tester",
            "spec": {
                "language": "python",
                "target_hardware": ["cpu"],
                "entry_point": "main.py::run",
                "destination_passing_style": dps,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )


@pytest.fixture(autouse=True)
def _off(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()


def _fallback(*args):
    raise AssertionError("the solution was not routed to")


@pytest.mark.parametrize("dps", [True, False], ids=["dps-solution", "returning-solution"])
def test_apply_takes_both_styles_whatever_the_solution_is(tmp_path, dps):
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    write_solution(root, _solution("s", DPS if dps else RETURNS, dps), "scale")
    rt.enable_apply(root)
    x, w = torch.randn(3, 64), torch.randn(64)
    # Value-returning: the inputs only; the outputs come back.
    assert torch.equal(rt.apply(NAME, args=(x, w), fallback=_fallback), x * w)
    assert torch.equal(rt.apply(NAME, args=(x,), kwargs={"w": w}, fallback=_fallback), x * w)
    # Destination-passing: the inputs and then the outputs, written into; None comes back.
    y = torch.zeros(3, 64)
    assert rt.apply(NAME, args=(x, w, y), fallback=_fallback) is None
    assert torch.equal(y, x * w)
    y = torch.zeros(3, 64)
    assert rt.apply(NAME, kwargs={"x": x, "w": w, "y": y}, fallback=_fallback) is None
    assert torch.equal(y, x * w)
    assert rt.stats()[f"{__name__}._fallback"]["hit"] == 4


def test_a_wrong_number_of_arguments_names_both_styles(tmp_path):
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    write_solution(root, _solution("s", DPS, True), "scale")
    rt.enable_apply(root, strict=True)
    with pytest.raises(rt.SolutionError) as info:
        rt.apply(NAME, args=(torch.randn(3, 64),), fallback=_fallback)
    assert "called with 1 arguments; the definition takes its 2 inputs (x, w), or those " in str(
        info.value
    )


def test_the_definition_comes_from_the_catalogue_when_the_solution_stands_alone(tmp_path):
    # A Solution JSON outside any dataset: rmsnorm_h128 is in fibgen's built-in catalogue.
    source = (
        "import torch\n\n"
        "def run(hidden_states, weight, output):\n"
        "    x = hidden_states.float()\n"
        "    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * weight.float()\n"
        "    output.copy_(y.to(hidden_states.dtype))\n"
    )
    doc = json.loads(_solution("norm", source, True).model_dump_json())
    doc["definition"] = "rmsnorm_h128"
    path = tmp_path / "norm.json"
    path.write_text(json.dumps(doc))
    rt.enable_apply({"rmsnorm_h128": str(path)}, patch=False)
    x, w = torch.randn(2, 128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)
    out = rt.apply("rmsnorm_h128", args=(x, w), fallback=_fallback)
    assert out.shape == (2, 128) and out.dtype == torch.bfloat16


def test_a_scaffold_folder_is_routed_from_its_files_without_traces(tmp_path):
    # enable_apply(folder) with no traces: every solution under solutions/, at any depth; a
    # solution folder runs its files as they are now, not the sources its JSON holds.
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    folder = root / "solutions" / "me" / "scale" / NAME / "mine"
    folder.mkdir(parents=True)
    (folder / "mine.json").write_text(_solution("mine", RETURNS, False).model_dump_json())
    (folder / "main.py").write_text("def run(x, w):\n    return x * w + 1\n")
    rt.enable_apply(root)
    x, w = torch.randn(3, 64), torch.randn(64)
    assert torch.equal(rt.apply(NAME, args=(x, w), fallback=_fallback), x * w + 1)
