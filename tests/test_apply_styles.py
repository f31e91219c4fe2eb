"""Hand-written `apply(name, args)` takes both calling styles, as flashinfer-bench's does."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch

import fibgen.runtime as rt
from fibgen.format import Definition, Solution, write_definition, write_solution

from _bench_dataset import DEFINITION, make_dataset

# Slow as a whole: each case in a process of its own.
pytestmark = pytest.mark.slow

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
    assert rt.stats()[f"fibgen.runtime.apply({NAME!r})"]["hit"] == 4


def test_a_wrong_number_of_arguments_names_both_styles(tmp_path):
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    write_solution(root, _solution("s", DPS, True), "scale")
    rt.enable_apply(root, strict=True)
    # The caller's mistake, refused before the solution sees it (Note [hand-written inputs]).
    with pytest.raises(rt.FallbackError) as info:
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
    monkeypatch.setattr(sys.modules["fibgen.runtime.routing.apply"].STATE, "warned", set())
    if enabled:
        rt.enable_apply(make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,)))
    x, w = torch.randn(2, 128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match=r"apply\('rmsnorm_h128'\) without a fallback"):
        out = rt.apply("rmsnorm_h128", args=(x, w))
    # bf16 outputs of two computations differ by a rounding step: 2**-8 relative.
    assert torch.allclose(out.float(), _rmsnorm(x, w).float(), atol=1e-2, rtol=1e-2)
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


# ---------------------------------------------------------------------------------------
# Keyed selections: a winner per var-axis key, of either style, called in either style.

FILL = {"small": 1.0, "large": 2.0}


def _filling(name: str, dps: bool) -> Solution:
    fill = FILL[name]
    source = (
        f"def run(x, w, y):\n    y.fill_({fill})\n"
        if dps
        else f"import torch\n\ndef run(x, w):\n    return torch.full_like(x, {fill})\n"
    )
    return _solution(name, source, dps)


def _keyed_dataset(root, small_dps: bool, large_dps: bool):
    """scale_h64, which only this dataset defines: "small" wins n=3, "large" n=17."""
    from fibgen.format import Trace, append_traces

    make_dataset(root, [], sizes=(3, 17))
    write_solution(root, _filling("small", small_dps), "scale")
    write_solution(root, _filling("large", large_dps), "scale")

    def trace(solution, n, latency):
        return Trace.model_validate(
            {
                "definition": NAME,
                "workload": {"uuid": f"n{n}", "axes": {"n": n}, "inputs": {}},
                "solution": solution,
                "evaluation": {
                    "status": "PASSED",
                    "environment": {"hardware": "cpu"},
                    "timestamp": "2026-01-01T00:00:00",
                    "correctness": {"max_absolute_error": 0.0, "max_relative_error": 0.0},
                    "performance": {
                        "latency_ms": latency,
                        "reference_latency_ms": 1.0,
                        "speedup_factor": 1.0 / latency,
                    },
                },
            }
        )

    append_traces(
        root,
        "scale",
        [trace("small", 3, 0.5), trace("small", 17, 2.0), trace("large", 3, 2.0),
         trace("large", 17, 0.5)],
    )  # fmt: skip
    return root


STYLES = [(False, False), (True, True), (False, True), (True, False)]
STYLE_IDS = ["returns+returns", "dps+dps", "returns+dps", "dps+returns"]


@pytest.mark.parametrize("small_dps, large_dps", STYLES, ids=STYLE_IDS)
def test_keyed_winners_take_both_calling_styles(tmp_path, small_dps, large_dps):
    from fibgen.runtime.selection.best import build_table

    root = _keyed_dataset(tmp_path / "ds", small_dps, large_dps)
    assert build_table(root)["definitions"][NAME]["keyed"]["keys"] == [
        [[3], "small"],
        [[17], "large"],
    ]
    rt.enable_apply(root)

    @rt.apply(NAME)
    def returning(x, w):
        raise AssertionError("not routed")

    @rt.apply(NAME)
    def writing(x, w, y):
        raise AssertionError("not routed")

    w = torch.ones(64)
    calls = 0
    # n=5 is traced by no workload: the definition's best (a tie, broken by name: "large").
    for n, fill in ((3, 1.0), (17, 2.0), (5, 2.0)):
        x, want = torch.zeros(n, 64), torch.full((n, 64), fill)
        assert torch.equal(rt.apply(NAME, args=(x, w), fallback=_fallback), want)
        assert torch.equal(rt.apply(NAME, kwargs={"x": x, "w": w}, fallback=_fallback), want)
        assert torch.equal(rt.apply(NAME, args=(x, w)), want)
        assert torch.equal(returning(x, w), want)
        for call in (
            lambda y: rt.apply(NAME, args=(x, w, y), fallback=_fallback),
            lambda y: rt.apply(NAME, kwargs={"x": x, "w": w, "y": y}, fallback=_fallback),
            lambda y: rt.apply(NAME, args=(x, w, y)),
            lambda y: writing(x, w, y),
        ):
            y = torch.zeros(n, 64)
            assert call(y) is None and torch.equal(y, want)
        calls += 8
    counts = rt.stats()
    assert sum(c["hit"] for c in counts.values()) == calls
    assert all(c["error"] == 0 and c["fallback_no_candidate"] == 0 for c in counts.values())


@pytest.mark.parametrize("dps_call", [False, True], ids=["value-call", "dps-call"])
@pytest.mark.parametrize("small_dps, large_dps", STYLES, ids=STYLE_IDS)
def test_keyed_fallbacks_run_the_datasets_reference(tmp_path, small_dps, large_dps, dps_call):
    # scale_h64 is in this dataset only: fibgen's catalogue cannot stand in for it.
    from fibgen.paths import builtin_definition_file

    assert builtin_definition_file(NAME) is None
    root = _keyed_dataset(tmp_path / "ds", small_dps, large_dps)
    x, w = torch.randn(5, 64), torch.randn(64)  # n=5: a key no trace covers

    def call():
        if not dps_call:
            return rt.apply(NAME, args=(x, w))
        y = torch.zeros(5, 64)
        assert rt.apply(NAME, args=(x, w, y)) is None
        return y

    # The original is the reference here: hand-written apply without a fallback.
    rt.enable_apply(root, {"*": {"on_miss": "fallback"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "without a fallback: ... runs the reference (slow)"
        assert torch.equal(call(), x * w)
    (counts,) = rt.stats().values()
    assert (counts["fallback_declined"], counts["hit"], counts["error"]) == (1, 0, 0)
    # The keyed entry's own miss policy: the reference, served as a hit.
    rt.enable_apply(root, {"*": {"on_miss": "reference"}})
    assert torch.equal(call(), x * w)
    (counts,) = rt.stats().values()
    assert (counts["hit"], counts["error"]) == (1, 0)


def test_the_input_check_follows_the_dataset_apply_is_enabled_on(tmp_path):
    # Note [hand-written inputs]: a check is made from the definition of the dataset the
    # solution came from, and made again when enable_apply replaces the routing table.
    from _bench_dataset import solution

    first = make_dataset(tmp_path / "h64", ["good_returns"])
    second = tmp_path / "h32"
    narrow = json.loads(json.dumps(DEFINITION))
    narrow["axes"]["h"]["value"] = 32
    write_definition(second, Definition.model_validate(narrow))
    write_solution(second, solution("good_returns"), "scale")

    def fallback(x, w):
        return "fallback"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(first)
        x, w = torch.ones(2, 64), torch.full((64,), 2.0)
        assert torch.equal(rt.apply(NAME, (x, w), fallback=fallback), x * w)
        assert rt.apply(NAME, (torch.ones(2, 32), torch.ones(32)), fallback=fallback) == "fallback"
        rt.enable_apply(second)
        x, w = torch.ones(2, 32), torch.full((32,), 3.0)
        assert torch.equal(rt.apply(NAME, (x, w), fallback=fallback), x * w)
