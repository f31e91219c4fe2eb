"""Hand-written `apply(name, args)` takes both calling styles, as flashinfer-bench's does."""

from __future__ import annotations

import json
import sys
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


# ---------------------------------------------------------------------------------------
# Without a fallback: flashinfer-bench 0.1.2 takes `fallback` as optional.


@pytest.mark.parametrize("dps", [True, False], ids=["dps-solution", "returning-solution"])
def test_apply_without_a_fallback_routes_both_styles(tmp_path, dps):
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    write_solution(root, _solution("s", DPS if dps else RETURNS, dps), "scale")
    rt.enable_apply(root)
    x, w = torch.randn(3, 64), torch.randn(64)
    assert torch.equal(rt.apply(NAME, args=(x, w)), x * w)
    assert torch.equal(rt.apply(NAME, args=(x,), kwargs={"w": w}), x * w)
    y = torch.zeros(3, 64)
    assert rt.apply(NAME, args=(x, w, y)) is None
    assert torch.equal(y, x * w)
    (counts,) = rt.stats().values()
    assert counts["hit"] == 3 and counts["fallback_no_candidate"] == 0


def _rmsnorm(x, w):
    y = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-5) * w.float()
    return y.to(x.dtype)


@pytest.mark.parametrize("enabled", [True, False], ids=["miss", "apply-off"])
def test_a_call_no_solution_serves_runs_the_reference_without_a_fallback(
    tmp_path, monkeypatch, enabled
):
    # rmsnorm_h128 is in fibgen's catalogue: its reference computes the result, in the
    # style of the call, where flashinfer-bench would raise "no fallback provided".
    monkeypatch.setattr(sys.modules["fibgen.runtime.apply"]._state, "warned", set())
    if enabled:
        rt.enable_apply(make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,)))
    x, w = torch.randn(2, 128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match=r"apply\('rmsnorm_h128'\) without a fallback"):
        out = rt.apply("rmsnorm_h128", args=(x, w))
    assert torch.allclose(out.float(), _rmsnorm(x, w).float(), atol=1e-2)
    y = torch.empty_like(x)
    assert rt.apply("rmsnorm_h128", args=(x, w, y)) is None
    assert torch.equal(y, out)
    if enabled:
        counts = rt.stats()["fibgen.runtime.apply('rmsnorm_h128')"]
        assert counts["fallback_no_candidate"] == 2 and counts["hit"] == 0


def test_a_failing_solution_falls_back_to_the_datasets_reference_without_a_fallback(tmp_path):
    root = make_dataset(tmp_path / "ds", ["raises"], sizes=(3,))
    rt.enable_apply(root)
    x, w = torch.randn(3, 64), torch.randn(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(rt.apply(NAME, args=(x, w)), x * w)  # scale_h64's reference
    (counts,) = rt.stats().values()
    assert counts["error"] == 1


def test_a_miss_without_a_fallback_or_a_definition_raises_naming_it(tmp_path):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    rt.enable_apply(root)
    with pytest.raises(LookupError) as info:
        rt.apply("no_such_definition_h1", args=(torch.randn(3),))
    message = str(info.value)
    assert message.startswith("apply('no_such_definition_h1'): no solution serves this call")
    where = f"definition 'no_such_definition_h1' is not in {root}/definitions or fibgen's catalogue"
    assert where in message
    assert "pass fallback=" in message


def test_a_mistyped_name_without_a_fallback_names_the_closest_definitions():
    with pytest.raises(LookupError) as info:
        rt.apply("rmsnorm_h4069", args=(torch.randn(2, 4096), torch.randn(4096)))
    assert "to run its reference (did you mean 'rmsnorm_h4096'," in str(info.value)


def test_strict_apply_without_a_fallback_raises_on_a_miss(tmp_path):
    rt.enable_apply(make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,)), strict=True)
    with pytest.raises(rt.FallbackError, match="rmsnorm_h128"):
        rt.apply("rmsnorm_h128", args=(torch.randn(2, 128), torch.randn(128)))
