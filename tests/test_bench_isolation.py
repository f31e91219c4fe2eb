"""What one solution does cannot change another's verdict or its own check: each runs in a
process of its own, judged by the worker that never runs one (Note [isolated solutions] in
fibgen/bench/isolation.py); a solution that changes its inputs, or returns what apply would
refuse, fails (Note [mutated inputs], Note [returned outputs] in fibgen/bench/worker.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import _bench_dataset
from _bench_dataset import make_dataset
from fibgen.bench.runner import BenchOptions, run_bench
from fibgen.format import Definition, Solution, Workload, write_definition, write_solution
from fibgen.format import write_workloads

# Slow as a whole: bench workers, each starting solution processes.
pytestmark = pytest.mark.slow

OPTIONS = BenchOptions(timeout=30, warmup=1, repeat=3)

# Correct itself, but at import makes `.double()` a no-op for whatever runs after it in its
# process: wrong_dtype then returns float32, as the reference does.
POISONS = (
    "import torch\n\ntorch.Tensor.double = lambda self: self\n\n"
    "def run(x, w):\n    return x * w\n",
    False,
)

# At import, every class of the process with a `check_outputs` (bench's worker among them)
# passes whatever it is given; returns float64 where the definition says float32.
PATCHES_THE_CHECK = (
    "import sys\n\n"
    "def _passes(self, *args, **kwargs):\n"
    "    return None, {'max_absolute_error': 0.0, 'max_relative_error': 0.0}\n\n"
    "for module in list(sys.modules.values()):\n"
    "    for value in list(getattr(module, '__dict__', {}).values()):\n"
    "        if isinstance(value, type) and 'check_outputs' in vars(value):\n"
    "            value.check_outputs = _passes\n\n"
    "def run(x, w):\n    return (x * w).double()\n",
    False,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))


def _evaluations(root: Path) -> dict[tuple[str, str], dict]:
    lines = (root / "traces" / "scale" / "scale_h64.jsonl").read_text().splitlines()
    traces = [json.loads(line) for line in lines]
    return {(t["workload"]["uuid"], t["solution"]): t["evaluation"] for t in traces}


def _statuses(root: Path) -> dict[str, str]:
    return {s: e["status"] for (_, s), e in _evaluations(root).items()}


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "shared"])
def test_what_a_solution_does_at_import_does_not_reach_the_next(tmp_path, monkeypatch, isolate):
    monkeypatch.setitem(_bench_dataset.SOLUTIONS, "a_poisons", POISONS)
    root = make_dataset(tmp_path / "ds", ["a_poisons", "wrong_dtype"], sizes=(3,))
    run_bench(root, BenchOptions(timeout=30, warmup=1, repeat=3, isolate=isolate), progress=False)
    # Solutions run in name order: a_poisons first. Without isolation its patch stays in the
    # worker, and the wrong solution passes: what isolation is for.
    wrong = "INCORRECT_DTYPE" if isolate else "PASSED"
    assert _statuses(root) == {"a_poisons": "PASSED", "wrong_dtype": wrong}


def test_every_solution_runs_in_a_fresh_process(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    pids.mkdir()
    for name in ("first", "second", "third"):
        source = (
            f"import os, pathlib\n\npathlib.Path({str(pids)!r}, {name!r}).write_text("
            "str(os.getpid()))\n\ndef run(x, w):\n    return x * w\n"
        )
        monkeypatch.setitem(_bench_dataset.SOLUTIONS, name, (source, False))
    root = make_dataset(tmp_path / "ds", ["first", "second", "third"], sizes=(3,))
    summary = run_bench(root, OPTIONS, progress=False)
    assert summary.statuses == {"PASSED": 3}
    seen = {p.name: int(p.read_text()) for p in pids.iterdir()}
    assert len(set(seen.values())) == 3 and os.getpid() not in seen.values()


def test_a_solution_that_patches_the_check_does_not_pass(tmp_path, monkeypatch):
    monkeypatch.setitem(_bench_dataset.SOLUTIONS, "patches_the_check", PATCHES_THE_CHECK)
    root = make_dataset(tmp_path / "ds", ["patches_the_check", "wrong_dtype"], sizes=(3,))
    run_bench(root, OPTIONS, progress=False)
    evaluations = _evaluations(root)
    patched = evaluations[("n3", "patches_the_check")]
    assert patched["status"] == "RUNTIME_ERROR"
    assert patched["log"] == (
        "the solution's process reported PASSED, but bench's checks of its outputs were not "
        "made as they are (none of first, again); a solution must not change bench's code"
    )
    assert "performance" not in patched
    assert evaluations[("n3", "wrong_dtype")]["status"] == "INCORRECT_DTYPE"


def test_the_check_without_isolation_is_the_solutions_to_patch(tmp_path, monkeypatch):
    # What isolation prevents, shown by turning it off: the measurement mode only.
    monkeypatch.setitem(_bench_dataset.SOLUTIONS, "patches_the_check", PATCHES_THE_CHECK)
    root = make_dataset(tmp_path / "ds", ["patches_the_check", "wrong_dtype"], sizes=(3,))
    run_bench(root, BenchOptions(timeout=30, warmup=1, repeat=3, isolate=False), progress=False)
    assert _statuses(root) == {"patches_the_check": "PASSED", "wrong_dtype": "PASSED"}


def test_a_crash_or_hang_in_a_solution_process_leaves_the_worker_and_its_inputs(
    tmp_path, monkeypatch
):
    root = make_dataset(tmp_path / "ds", ["aborts", "good_returns", "hangs"], sizes=(3,))
    run_bench(root, BenchOptions(timeout=3, warmup=1, repeat=3), progress=False)
    evaluations = _evaluations(root)
    assert evaluations[("n3", "aborts")]["status"] == "RUNTIME_ERROR"
    assert evaluations[("n3", "aborts")]["log"] == "worker process killed by SIGABRT"
    assert evaluations[("n3", "good_returns")]["status"] == "PASSED"
    assert evaluations[("n3", "hangs")]["status"] == "TIMEOUT"


# ---------------------------------------------------------------------------------------
# Inputs a solution changed (Note [mutated inputs])


MUTATES = {
    "mutates_returns": ("def run(x, w):\n    x.mul_(w)\n    return x.clone()\n", False),
    "mutates_dps": ("def run(x, w, y):\n    w.zero_()\n    y.copy_(x * 0)\n", True),
    "mutates_and_wrong": ("def run(x, w):\n    x[0, 0] = 7.0\n    return x * w + 1\n", False),
}


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "shared"])
def test_a_solution_that_changes_its_inputs_fails_and_says_so(tmp_path, monkeypatch, isolate):
    for name, source in MUTATES.items():
        monkeypatch.setitem(_bench_dataset.SOLUTIONS, name, source)
    root = make_dataset(tmp_path / "ds", [*MUTATES, "good_returns"], sizes=(3,))
    run_bench(root, BenchOptions(timeout=30, warmup=1, repeat=3, isolate=isolate), progress=False)
    evaluations = _evaluations(root)
    rule = (
        "; a solution must leave its inputs as it found them (the caller reads them after "
        "the call, and so does apply's fallback)"
    )
    returns = evaluations[("n3", "mutates_returns")]
    assert returns["status"] == "INCORRECT_NUMERICAL"
    assert (
        returns["log"] == "the call changed its input(s): 'x' (192 of 192 elements differ)" + rule
    )
    dps = evaluations[("n3", "mutates_dps")]
    # Its output is right for the inputs it left (zeros): the changed input is what fails it.
    assert dps["status"] == "INCORRECT_NUMERICAL"
    assert "the call changed its input(s): 'w' (64 of 64 elements differ)" in dps["log"]
    both = evaluations[("n3", "mutates_and_wrong")]
    assert both["status"] == "INCORRECT_NUMERICAL"
    assert both["log"].startswith("output 'y': FAILED")
    assert both["log"].endswith(
        "\nthe call changed its input(s): 'x' (1 of 192 elements differ)" + rule
    )
    assert evaluations[("n3", "good_returns")]["status"] == "PASSED"


# ---------------------------------------------------------------------------------------
# What a solution returns, judged as apply's dispatchers judge it (Note [returned outputs])


TWO_OUTPUTS = {
    "name": "split_h64",
    "op_type": "scale",
    "tags": [],
    "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 64}},
    "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
    "outputs": {
        "y": {"shape": ["n", "h"], "dtype": "float32"},
        "z": {"shape": ["n", "h"], "dtype": "float32"},
    },
    "reference": "import torch\n\ndef run(x):\n    return x * 2, x * 3\n",
}


def _two_output_solution(name: str, body: str) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "split_h64",
            "author": "tester",
            "spec": {
                "language": "python",
                "target_hardware": ["cpu"],
                "entry_point": "main.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": f"def run(x):\n    return {body}\n"}],
        }
    )


def test_a_container_apply_refuses_is_incorrect_shape(tmp_path, monkeypatch):
    monkeypatch.setitem(
        _bench_dataset.SOLUTIONS, "one_tuple", ("def run(x, w):\n    return (x * w,)\n", False)
    )
    monkeypatch.setitem(
        _bench_dataset.SOLUTIONS, "one_list", ("def run(x, w):\n    return [x * w]\n", False)
    )
    root = make_dataset(tmp_path / "ds", ["one_tuple", "one_list", "good_returns"], sizes=(3,))
    write_definition(root, Definition.model_validate(TWO_OUTPUTS))
    write_workloads(
        root,
        "scale",
        "split_h64",
        [
            Workload.model_validate(
                {"uuid": "m3", "axes": {"n": 3}, "inputs": {"x": {"type": "random"}}}
            )
        ],
    )
    for name, body in (("pair_tuple", "x * 2, x * 3"), ("pair_list", "[x * 2, x * 3]")):
        write_solution(root, _two_output_solution(name, body), "scale")
    run_bench(root, OPTIONS, progress=False)
    single = _evaluations(root)
    assert single[("n3", "good_returns")]["status"] == "PASSED"
    for name, container in (("one_tuple", "tuple"), ("one_list", "list")):
        assert single[("n3", name)] == {
            **single[("n3", name)],
            "status": "INCORRECT_SHAPE",
            "log": f"returned a {container} of 1; a definition with one output (y) takes the "
            f"tensor itself, as fibgen's dispatcher does (it refuses a {container})",
        }
    lines = (root / "traces" / "scale" / "split_h64.jsonl").read_text().splitlines()
    pair = {json.loads(line)["solution"]: json.loads(line)["evaluation"] for line in lines}
    assert pair["pair_tuple"]["status"] == "PASSED"
    assert pair["pair_list"]["status"] == "INCORRECT_SHAPE"
    assert pair["pair_list"]["log"] == (
        "returned a list of 2; a definition with 2 outputs takes a tuple of them (y, z), as "
        "fibgen's dispatcher does (it refuses a list)"
    )


def test_a_solution_process_that_sends_garbage_is_a_runtime_error(tmp_path, monkeypatch):
    garbles = (
        "import sys\n\nsys.modules['fibgen.bench.isolation']._send = (\n"
        "    lambda conn, message, frames=(): conn.send_bytes(b'\\xff not json')\n)\n\n"
        "def run(x, w):\n    return x * w\n",
        False,
    )
    monkeypatch.setitem(_bench_dataset.SOLUTIONS, "garbles", garbles)
    root = make_dataset(tmp_path / "ds", ["garbles", "good_returns"], sizes=(3,))
    run_bench(root, OPTIONS, progress=False)
    evaluations = _evaluations(root)
    assert evaluations[("n3", "garbles")]["status"] == "RUNTIME_ERROR"
    assert evaluations[("n3", "garbles")]["log"].startswith(
        "the solution's process broke bench's protocol (a message that is not JSON ("
    )
    assert evaluations[("n3", "good_returns")]["status"] == "PASSED"
