"""The best-solution table: ranking, per-key choices, miss policies, cache, and apply."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from fibgen.format import Solution, Trace, append_traces
from fibgen.runtime import apply, disable_apply, enable_apply, stats
from fibgen.runtime.errors import ApplyConfigError
from fibgen.runtime.selection import best as select
from fibgen.runtime.selection.best import Policy, build_table, entries, load_table

from _bench_dataset import DEFINITION, make_dataset
from _shared import require_flashinfer_bench

# Each solution fills its output with its own constant, so a test sees which one ran.
FILLS = {"small_fast": 1.0, "large_fast": 2.0, "broken_fast": 3.0, "steady": 4.0}


def _solution(name: str) -> Solution:
    source = f"import torch\n\ndef run(x, w):\n    return torch.full_like(x, {FILLS[name]})\n"
    return Solution.model_validate(
        {
            "name": name,
            "definition": DEFINITION["name"],
            "author": "tester",
            "spec": {
                "language": "python",
                "target_hardware": ["cpu"],
                "entry_point": "main.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": source}],
        }
    )


def _trace(
    solution: str,
    n: int,
    latency: float,
    status: str = "PASSED",
    abs_err=1e-3,
    e2e=None,
    own=None,
    ref_e2e=20.0,
):
    evaluation = {
        "status": status,
        "environment": {"hardware": "cpu"},
        "timestamp": "2026-01-01T00:00:00",
    }
    if status in ("PASSED", "INCORRECT_NUMERICAL"):
        evaluation["correctness"] = {"max_absolute_error": abs_err, "max_relative_error": abs_err}
    if status == "PASSED":
        evaluation["performance"] = {
            "latency_ms": latency,
            "reference_latency_ms": 10.0,
            "speedup_factor": 10.0 / latency,
        }
        if e2e is not None:
            evaluation["performance"]["e2e_latency_ms"] = e2e
            evaluation["performance"]["reference_e2e_latency_ms"] = ref_e2e
        if own is not None:
            # The API's own function, timed beside the solution (Note [bench e2e]).
            evaluation["performance"]["original_latency_ms"] = own[0]
            evaluation["performance"]["original_e2e_latency_ms"] = own[1]
    return Trace.model_validate(
        {
            "definition": DEFINITION["name"],
            "workload": {"uuid": f"n{n}", "axes": {"n": n}, "inputs": {}},
            "solution": solution,
            "evaluation": evaluation,
        }
    )


@pytest.fixture()
def dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [])
    from fibgen.format import write_solution

    for name in FILLS:
        write_solution(root, _solution(name), "scale")
    append_traces(
        root,
        "scale",
        [
            _trace("small_fast", 3, 1.0),
            _trace("small_fast", 17, 8.0),
            _trace("large_fast", 3, 2.0),
            _trace("large_fast", 17, 4.0),
            _trace("steady", 3, 1.5),
            _trace("steady", 17, 4.5),
            # Fastest of all where it passes, but wrong on another workload: chosen where it
            # passed, and nowhere else.
            _trace("broken_fast", 3, 0.1),
            _trace("broken_fast", 17, 0.1, status="INCORRECT_NUMERICAL"),
        ],
    )
    yield root
    disable_apply()


def test_table_ranks_passing_solutions_and_picks_per_key(dataset):
    table = build_table(dataset)["definitions"][DEFINITION["name"]]
    # Geometric mean speedup: steady (10/1.5, 10/4.5) beats small_fast and large_fast.
    # broken_fast failed at n=17: it is not trusted, so not ranked, but it serves n=3.
    assert table["ranking"] == ["steady", "large_fast", "small_fast"]
    assert table["keyed"]["keys"] == [[[3], "broken_fast"], [[17], "large_fast"]]
    assert table["keyed"]["trusted"] == [[[3], "small_fast"], [[17], "large_fast"]]


def _e2e_traces(root, with_e2e=True):
    # small_fast is the faster kernel everywhere, and the slower call: its launch costs.
    e2e = (lambda ms: ms) if with_e2e else (lambda ms: None)
    append_traces(
        root,
        "scale",
        [
            _trace("small_fast", 3, 0.5, e2e=e2e(3.0)),
            _trace("small_fast", 17, 1.0, e2e=e2e(3.5)),
            _trace("large_fast", 3, 0.6, e2e=e2e(1.0)),
            _trace("large_fast", 17, 1.2, e2e=e2e(1.5)),
            _trace("steady", 3, 0.9, e2e=e2e(1.2)),
            _trace("steady", 17, 1.9, e2e=e2e(2.0)),
            # Where it passed, the fastest kernel and the slowest call.
            _trace("broken_fast", 3, 0.05, e2e=e2e(5.0)),
        ],
    )


def test_selection_ranks_by_the_eager_call_unless_told_gpu(dataset):
    _e2e_traces(dataset)
    name = DEFINITION["name"]
    by_call = build_table(dataset)["definitions"][name]
    assert by_call["ranking"] == ["large_fast", "steady", "small_fast"]
    assert "keyed" not in by_call  # large_fast is the fastest call at every key
    by_kernel = build_table(dataset, {"*": {"metric": "gpu"}})["definitions"][name]
    assert by_kernel["ranking"] == ["small_fast", "large_fast", "steady"]
    with pytest.raises(ApplyConfigError, match="metric must be one of e2e, gpu, not 'cpu'"):
        build_table(dataset, {"*": {"metric": "cpu"}})


def test_traces_without_e2e_figures_are_ranked_by_gpu_time(dataset):
    # As flashinfer-bench writes them: latency_ms only.
    _e2e_traces(dataset, with_e2e=False)
    name = DEFINITION["name"]
    assert build_table(dataset)["definitions"][name]["ranking"][0] == "small_fast"


def test_tolerance_policy_excludes_traces_with_large_errors(dataset):
    append_traces(dataset, "scale", [_trace("large_fast", 5, 1.0, abs_err=0.5)])
    table = build_table(dataset, {"*": {"atol": 0.1}})["definitions"][DEFINITION["name"]]
    assert "large_fast" not in table["ranking"]
    loose = build_table(dataset, {"*": {"atol": 1.0}})["definitions"][DEFINITION["name"]]
    assert "large_fast" in loose["ranking"]


def test_table_is_cached_and_rebuilt_when_traces_change(dataset):
    first, cached = load_table(dataset)
    assert not cached
    again, cached = load_table(dataset)
    assert cached and again == first
    # A different config is a different table.
    _, cached = load_table(dataset, Policy(on_miss="nearest"))
    assert not cached
    append_traces(dataset, "scale", [_trace("steady", 17, 0.5)])
    rebuilt, cached = load_table(dataset)
    assert not cached
    assert rebuilt["definitions"][DEFINITION["name"]]["ranking"][0] == "steady"


def _call(n: int) -> float:
    @apply(DEFINITION["name"])
    def scale(x, w):
        return x * w

    x = torch.randn(n, 64)
    return float(scale(x=x, w=torch.ones(64))[0, 0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy, expected",
    [
        # n=4's nearest traced key is 3, whose trusted winner serves it, not broken_fast.
        ("best", {3: 3.0, 17: 2.0, 4: 4.0, 100: 4.0}),
        ("nearest", {3: 3.0, 17: 2.0, 4: 1.0, 100: 2.0}),
    ],
)
def test_enable_apply_routes_by_var_axis_key(dataset, policy, expected):
    enable_apply(dataset, {"*": {"on_miss": policy}})
    assert {n: _call(n) for n in expected} == expected


def test_reference_on_miss_runs_the_reference(dataset):
    enable_apply(dataset, Policy(on_miss="reference"))
    x = torch.randn(5, 64)

    @apply(DEFINITION["name"])
    def scale(x, w):
        return x * w

    assert torch.equal(scale(x=x, w=torch.full((64,), 2.0)), x * 2)


def test_fallback_on_miss_hands_untraced_keys_to_the_original(dataset):
    enable_apply(dataset, {"*": {"on_miss": "fallback"}})
    originals = []

    @apply(DEFINITION["name"])
    def scale(x, w):
        originals.append(x.shape[0])
        return x * w

    w = torch.full((64,), 2.0)
    for n, fill in ((3, 3.0), (17, 2.0)):
        assert torch.equal(scale(x=torch.randn(n, 64), w=w), torch.full((n, 64), fill))
    for n in (5, 5, 100):
        x = torch.randn(n, 64)
        assert torch.equal(scale(x=x, w=w), x * 2)
    assert originals == [5, 5, 100]
    (counts,) = [c for label, c in stats().items() if label.endswith("scale")]
    assert (counts["hit"], counts["fallback_declined"]) == (2, 3)


@pytest.mark.slow
def test_enabling_builds_nothing_until_called(dataset, tmp_path):
    # Damage a solution that is chosen: enabling still succeeds, the first call reports it.
    path = next((dataset / "solutions").rglob("broken_fast.json"))
    doc = json.loads(path.read_text())
    doc["sources"][0]["content"] = "import no_such_module\n\ndef run(x, w):\n    return x\n"
    path.write_text(json.dumps(doc))
    found = entries(dataset)
    assert set(found) == {DEFINITION["name"]}
    enable_apply(dataset)
    assert _call(17) == 2.0
    # Not strict: the failure is reported once, counted, and the call falls back.
    with pytest.warns(RuntimeWarning, match="no_such_module"):
        _call(3)
    (counts,) = [c for label, c in stats().items() if label.endswith("scale")]
    assert counts["error"] == 1
    enable_apply(dataset, strict=True)
    with pytest.raises(Exception, match="no_such_module"):
        _call(3)


def test_prebuild_loads_the_top_solutions_at_enable(dataset):
    path = next((dataset / "solutions").rglob("large_fast.json"))
    doc = json.loads(path.read_text())
    doc["sources"][0]["content"] = "import no_such_module\n\ndef run(x, w):\n    return x\n"
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match="no_such_module"):
        enable_apply(dataset, {"*": {"prebuild": 2}})


def test_bad_config_is_reported(dataset):
    with pytest.raises(ApplyConfigError, match="on_miss"):
        enable_apply(dataset, {"*": {"on_miss": "sometimes"}})
    with pytest.raises(ApplyConfigError, match="traces/"):
        enable_apply({}, Policy())


@pytest.mark.parametrize(
    "policy, message",
    [
        ({"atol": "x"}, "config for '*': atol must be None or a finite number 0 or more, not 'x'"),
        ({"atol": float("nan")}, "atol must be None or a finite number 0 or more, not nan"),
        ({"rtol": -1}, "rtol must be None or a finite number 0 or more, not -1"),
        ({"rtol": float("inf")}, "rtol must be None or a finite number 0 or more, not inf"),
        ({"atol": True}, "atol must be None or a finite number 0 or more, not True"),
        ({"prebuild": 1.5}, "prebuild must be a whole number, not 1.5"),
        ({"prebuild": True}, "prebuild must be a whole number, not True"),
        ({"prebuild": -1}, "prebuild must be 0 or more, not -1"),
        ({"on_miss": None}, "on_miss must be one of best, nearest, fallback, reference, not None"),
        ({"metric": ["gpu"]}, "metric must be one of e2e, gpu, not ['gpu']"),
        ({"atoll": 1e-3}, "config for '*': unknown key 'atoll'; the keys are atol, rtol, on_miss"),
    ],
)
def test_every_policy_field_is_type_and_range_checked_with_its_key_named(dataset, policy, message):
    with pytest.raises(ApplyConfigError) as info:
        enable_apply(dataset, {"*": policy})
    text = str(info.value)
    assert message in text and "\n" not in text
    if "atoll" not in policy:  # a Policy built directly is checked alike
        with pytest.raises(ApplyConfigError, match="must be"):
            Policy(**policy)
    # What is valid stays valid: ints for tolerances, zero, None.
    assert Policy(atol=0, rtol=1, prebuild=0).atol == 0


@pytest.mark.slow
def test_select_imports_no_pydantic_or_compiler():
    import subprocess
    import sys

    code = (
        "import sys, fibgen.runtime.selection.best\n"
        "bad = [m for m in ('pydantic', 'lark', 'jinja2', 'fibgen.compiler') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


@pytest.mark.slow
def test_solution_folders_and_flashinfer_bench_trace_depths_are_routed(tmp_path, monkeypatch):
    # A scaffold's folder (<def>/<name>/<name>.json beside its sources) and traces where
    # flashinfer-bench writes them (traces/<op_type>/<def>.jsonl, a merge's traces/<def>.jsonl).
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [])
    for name in ("small_fast", "large_fast"):
        folder = root / "solutions" / "me" / "scale" / DEFINITION["name"] / name
        folder.mkdir(parents=True)
        solution = _solution(name)
        (folder / f"{name}.json").write_text(solution.model_dump_json())
        (folder / "main.py").write_text(solution.sources[0].content)
    (root / "traces" / "scale").mkdir(parents=True)
    (root / "traces" / "scale" / f"{DEFINITION['name']}.jsonl").write_text(
        _trace("small_fast", 3, 1.0).model_dump_json() + "\n"
    )
    (root / "traces" / f"{DEFINITION['name']}.jsonl").write_text(
        _trace("large_fast", 3, 0.5).model_dump_json() + "\n"
    )
    # The folder's file is the truth: the edit is what runs, though the JSON is older.
    folder = root / "solutions" / "me" / "scale" / DEFINITION["name"] / "large_fast"
    (folder / "main.py").write_text(
        "import torch\n\ndef run(x, w):\n    return torch.full_like(x, 7.0)\n"
    )
    try:
        with warnings.catch_warnings():
            # fibgen's own warnings only: a first import of FlashInfer for patching may warn
            # of its dependencies' deprecations.
            warnings.filterwarnings("error", message="fibgen")
            enable_apply(root)
        assert _call(3) == 7.0
    finally:
        disable_apply()


def test_a_dataset_with_nothing_usable_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [])
    from fibgen.format import write_solution

    write_solution(root, _solution("steady"), "scale")
    write_solution(root, _solution("small_fast"), "scale")
    append_traces(
        root,
        "scale",
        [_trace("steady", 3, 1.0, status="RUNTIME_ERROR"), _trace("gone", 3, 1.0)],
    )
    try:
        with pytest.warns(RuntimeWarning) as caught:
            enable_apply(root)
        assert str(caught[0].message) == (
            f"fibgen: {root}: nothing is routed: 2 solution file(s), 2 evaluated trace(s): "
            "1 solution(s) failed at every var-axis key they were benchmarked at (scale_h64/steady); "
            "1 solution(s) have no "
            f"benchmark traces (scale_h64/small_fast; run `fibgen bench {root}`); traces name "
            f"1 solution(s) not under {root}/solutions (scale_h64/gone)"
        )
    finally:
        disable_apply()


def test_an_empty_solutions_folder_says_so(tmp_path):
    (tmp_path / "solutions").mkdir()
    with pytest.warns(RuntimeWarning, match="holds no Solution JSON under"):
        enable_apply(tmp_path)
    disable_apply()


# ---------------------------------------------------------------------------------------
# Hardware: ranked per hardware, this machine's traces first, what cannot run here skipped

from fibgen.runtime.selection import hardware  # noqa: E402

H100 = hardware.Here("cuda", (hardware.normalize("NVIDIA H100 80GB HBM3"),))
CPU_HERE = hardware.Here("cpu", ("amd epyc", "x86 64", "cpu"))


def _on(trace, hw: str):
    doc = trace.model_dump(mode="json")
    doc["evaluation"]["environment"]["hardware"] = hw
    return Trace.model_validate(doc)


def _cuda_solution(name: str, target=("cuda",), language="cuda") -> Solution:
    file = "k.cu" if language == "cuda" else "main.py"
    return Solution.model_validate(
        {
            "name": name,
            "definition": DEFINITION["name"],
            "author": "tester",
            "spec": {
                "language": language,
                "target_hardware": list(target),
                "entry_point": f"{file}::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": file, "content": "def run(x, w):\n    return x * w\n"}],
        }
    )


@pytest.fixture()
def mixed(tmp_path, monkeypatch):
    """steady (python) timed on this CPU and on an H100; fast_cu (cuda) on the H100 only,
    far faster there than anything on the CPU."""
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [])
    from fibgen.format import write_solution

    write_solution(root, _solution("steady"), "scale")
    write_solution(root, _solution("small_fast"), "scale")
    write_solution(root, _cuda_solution("fast_cu"), "scale")
    gpu = "NVIDIA H100"
    append_traces(
        root,
        "scale",
        [
            _on(_trace("steady", 3, 0.5), gpu),
            _on(_trace("fast_cu", 3, 0.001), gpu),
            _on(_trace("fast_cu", 17, 0.001), gpu),
            # Run later on the CPU: these supersede nothing of the H100's.
            _on(_trace("steady", 3, 2.0), "AMD EPYC"),
            _on(_trace("steady", 3, 2.0, status="RUNTIME_ERROR"), gpu + " 80GB HBM3"),
            _on(_trace("small_fast", 3, 1.0), "x86_64"),  # an older fibgen's CPU name
            _on(_trace("small_fast", 17, 1.0), "x86_64"),
        ],
    )
    yield root
    disable_apply()


def test_a_cpu_ranks_on_its_own_traces_and_skips_what_needs_a_gpu(mixed):
    table = build_table(mixed, where=CPU_HERE)
    info = table["definitions"][DEFINITION["name"]]
    # fast_cu's 10,000x on the H100 is not compared with CPU latencies, nor can it run here.
    assert info["ranking"] == ["small_fast", "steady"] and info["measured_here"]
    assert table["unused"]["not_here"] == ["scale_h64/fast_cu: cuda needs a CUDA GPU"]


def test_a_gpu_ranks_on_its_traces_which_a_cpu_run_does_not_supersede(mixed):
    from fibgen.format import write_solution

    # For any device, timed on the CPU only: not ranked against the H100's traces.
    write_solution(mixed, _cuda_solution("anywhere", ("cuda", "cpu"), "python"), "scale")
    append_traces(mixed, "scale", [_on(_trace("anywhere", 3, 0.0001), "AMD EPYC")])
    table = build_table(mixed, where=H100)
    info = table["definitions"][DEFINITION["name"]]
    # "NVIDIA H100" and "NVIDIA H100 80GB HBM3" both name this GPU; steady failed here.
    assert info["ranking"] == ["fast_cu"] and info["hardware"] == "NVIDIA H100"
    assert table["unused"]["failed"] == ["scale_h64/steady"]
    # Declared for the CPU and never run here: not for this GPU.
    assert table["unused"]["not_here"] == ["scale_h64/small_fast: its target_hardware is cpu"]
    assert table["unused"]["other_hardware"] == ["scale_h64/anywhere"]
    assert "1 solution(s) have traces only from other hardware than their definition is " in (
        select.unused_message(mixed, table)
    )


def test_another_gpu_is_ranked_on_gpu_traces_and_the_warning_says_so(mixed):
    h200 = hardware.Here("cuda", ("nvidia h200",))
    table = build_table(mixed, where=h200)
    info = table["definitions"][DEFINITION["name"]]
    assert info["ranking"] == ["fast_cu"] and not info["measured_here"]
    message = select.unused_message(mixed, table)
    assert "1 definition(s) ranked on traces from other hardware than nvidia h200, which " in (
        message
    )
    assert "scale_h64 (NVIDIA H100)" in message


@pytest.mark.slow
def test_enable_apply_on_this_cpu_routes_to_what_runs_here_and_says_why_not_the_rest(
    mixed, monkeypatch
):
    monkeypatch.setattr(hardware, "_gpu_name", lambda: None)
    with pytest.warns(RuntimeWarning) as caught:
        enable_apply(mixed)
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(f"fibgen: {mixed}: 1 definition(s) routed; not usable: ")
    assert "1 solution(s) cannot run on this CPU (scale_h64/fast_cu: cuda needs a CUDA GPU)" in (
        message
    )
    assert _call(3) == FILLS["small_fast"]
    ((_, counts),) = stats().items()
    assert counts["hit"] == 1 and counts["error"] == 0


def test_target_hardware_counts_unless_the_solution_was_measured_here(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [])
    from fibgen.format import write_solution

    # Both Python, both declared for CUDA only; one has traces from this CPU.
    write_solution(root, _cuda_solution("gpu_only", language="python"), "scale")
    write_solution(root, _cuda_solution("ran_here", language="python"), "scale")
    append_traces(
        root,
        "scale",
        [
            _on(_trace("gpu_only", 3, 0.1), "NVIDIA H100"),
            _on(_trace("ran_here", 3, 1.0), "AMD EPYC"),
        ],
    )
    table = build_table(root, where=CPU_HERE)
    assert table["definitions"][DEFINITION["name"]]["ranking"] == ["ran_here"]
    assert table["unused"]["not_here"] == ["scale_h64/gpu_only: its target_hardware is cuda"]


@pytest.mark.slow
def test_solutions_for_definitions_nobody_has_are_said_at_enable(dataset):
    from fibgen.format import write_solution

    doc = _solution("steady").model_dump(mode="json")
    doc.update(name="orphan", definition="no_such_definition_h8")
    write_solution(dataset, Solution.model_validate(doc), "scale")
    with pytest.warns(RuntimeWarning) as caught:
        enable_apply(dataset)
    (message,) = [str(w.message) for w in caught]
    assert (
        f"1 solution(s) are for definitions that neither {dataset}/definitions nor fibgen's "
        "catalogue has (no_such_definition_h8/orphan); only a dispatcher that knows the name "
        "can route them"
    ) in message


@pytest.mark.parametrize(
    "text, kind",
    [
        ("NVIDIA H100 80GB HBM3", "cuda"),
        ("NVIDIA_H100", "cuda"),
        ("Tesla T4", "cuda"),
        ("gpu", "cuda"),
        ("cpu", "cpu"),
        ("x86_64", "cpu"),
        ("Intel(R) Xeon(R) Platinum 8480+", "cpu"),
        ("AMD EPYC 7B13", "cpu"),
        ("AMD Instinct MI300X GPU", "other"),
        ("Apple GPU (MPS)", "other"),
        ("Intel(R) Data Center GPU Max 1550", "other"),
        ("TPU v5e", "other"),
    ],
)
def test_hardware_strings_are_classified(text, kind):
    assert hardware.kind_of(text) == kind


def test_a_hardware_string_names_this_machine_by_its_leading_words():
    assert H100.is_here("NVIDIA H100") and H100.is_here("nvidia-h100-80gb-hbm3")
    assert not H100.is_here("NVIDIA H200") and not H100.is_here("cpu")
    assert CPU_HERE.is_here("x86_64") and CPU_HERE.is_here("AMD EPYC")
    assert not CPU_HERE.is_here("Intel(R) Xeon(R)") and CPU_HERE.tier("Intel(R) Xeon(R)") == 1
    assert CPU_HERE.tier("NVIDIA H100") == 2 and H100.tier("NVIDIA A100") == 1


# ---------------------------------------------------------------------------------------
# Per-trace judgement (Note [selection beside flashinfer-bench] in select_table.py)


def _workload_trace(solution: str, uuid: str, n: int, latency: float, status: str = "PASSED"):
    doc = _trace(solution, n, latency, status=status).model_dump(mode="json")
    doc["workload"]["uuid"] = uuid
    return Trace.model_validate(doc)


def partial_dataset(root, with_trusted: bool = True):
    """``partial`` is the fastest wherever it passed, and failed at n=64 and on one of the two
    workloads of n=5; ``trusted`` passed everywhere, slower."""
    from fibgen.format import write_solution

    make_dataset(root, [])
    names = ["small_fast"] + (["steady"] if with_trusted else [])
    for name in names:
        write_solution(root, _solution(name), "scale")
    traces = [
        _workload_trace("small_fast", "n3", 3, 0.5),
        _workload_trace("small_fast", "n17", 17, 0.5),
        _workload_trace("small_fast", "n64", 64, 0.5, status="INCORRECT_NUMERICAL"),
        _workload_trace("small_fast", "n5a", 5, 0.5),
        _workload_trace("small_fast", "n5b", 5, 0.5, status="RUNTIME_ERROR"),
    ]
    if with_trusted:
        traces += [
            _workload_trace("steady", uuid, n, 2.0)
            for uuid, n in (("n3", 3), ("n17", 17), ("n64", 64), ("n5a", 5), ("n5b", 5))
        ]
    append_traces(root, "scale", traces)
    return root


def test_a_failing_trace_takes_its_solution_off_its_own_key_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = partial_dataset(tmp_path / "ds")
    info = build_table(root)["definitions"][DEFINITION["name"]]
    # small_fast serves n=3 and n=17, where it passed; not n=64, where it failed, nor n=5,
    # where one of the key's two workloads failed (flashinfer-bench would pick it there).
    assert info["keyed"]["keys"] == [
        [[3], "small_fast"],
        [[5], "steady"],
        [[17], "small_fast"],
        [[64], "steady"],
    ]
    # Not trusted off its keys: the definition's best, and every key's choice on a miss.
    assert info["ranking"] == ["steady"]
    assert {s for _, s in info["keyed"]["trusted"]} == {"steady"}


def test_per_key_choices_are_flashinfer_benchs_but_where_a_key_also_failed(tmp_path, monkeypatch):
    fib = require_flashinfer_bench()
    from flashinfer_bench.apply.config import ApplyConfig, ApplyConfigRegistry
    from flashinfer_bench.apply.table import ApplyTable

    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "fib-cache"))
    root = partial_dataset(tmp_path / "ds")
    # Tolerances that admit every PASSED trace, as fibgen's default does; nothing built.
    registry = ApplyConfigRegistry(default=ApplyConfig(max_atol=1.0, max_rtol=1.0, aot_ratio=0))
    theirs = ApplyTable.load_or_build(fib.TraceSet.from_path(str(root)), registry)
    name = DEFINITION["name"]
    their_keys = {dict(k.axes)["n"]: s for k, s in theirs.index[name].items()}
    info = build_table(root)["definitions"][name]
    ours = {values[0]: s for values, s in info["keyed"]["keys"]}
    # n=5: one of small_fast's two workloads failed there; flashinfer-bench picks it anyway.
    assert their_keys == {**ours, 5: "small_fast"} and ours[5] == "steady"
    # Their best wins the most keys, though it failed on some; ours is trusted.
    assert theirs.def_best[name] == "small_fast" and info["ranking"] == ["steady"]


@pytest.mark.slow
@pytest.mark.parametrize("on_miss", ["best", "nearest"])
def test_a_partial_solution_never_serves_a_key_it_was_not_seen_to_pass(
    tmp_path, monkeypatch, on_miss
):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = partial_dataset(tmp_path / "ds")
    with pytest.warns(RuntimeWarning) as caught:
        enable_apply(root, {"*": {"on_miss": on_miss}})
    try:
        (message,) = [str(w.message) for w in caught]
        assert message == (
            f"fibgen: {root}: 1 definition(s) routed; 1 solution(s) failed at some var-axis "
            "keys and serve only the keys where they passed (scale_h64/small_fast)"
        )
        # n=4 is nearest to n=3, which small_fast serves: a trusted solution takes it.
        got = {n: _call(n) for n in (3, 17, 64, 5, 4, 100)}
        assert got == {3: 1.0, 17: 1.0, 64: 4.0, 5: 4.0, 4: 4.0, 100: 4.0}
    finally:
        disable_apply()


@pytest.mark.slow
@pytest.mark.parametrize("on_miss", ["best", "nearest", "fallback"])
def test_with_no_trusted_solution_a_miss_falls_back(tmp_path, monkeypatch, on_miss):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = partial_dataset(tmp_path / "ds", with_trusted=False)
    info = build_table(root)["definitions"][DEFINITION["name"]]
    assert info["ranking"] == [] and info["keyed"]["trusted"] == []
    originals = []

    @apply(DEFINITION["name"])
    def scale(x, w):
        originals.append(x.shape[0])
        return x * w

    with pytest.warns(RuntimeWarning, match="serve only the keys where they passed"):
        enable_apply(root, {"*": {"on_miss": on_miss}})
    try:
        w = torch.full((64,), 2.0)
        for n in (3, 17, 64, 5, 8):
            out = scale(torch.ones(n, 64), w)
            assert float(out[0, 0]) == (1.0 if n in (3, 17) else 2.0), n
        assert originals == [64, 5, 8]
        (counts,) = [c for label, c in stats().items() if label.endswith("scale")]
        assert (counts["hit"], counts["fallback_declined"]) == (2, 3)
    finally:
        disable_apply()


def test_a_partial_solution_on_a_definition_that_cannot_be_keyed_is_said(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = partial_dataset(tmp_path / "ds", with_trusted=False)
    # A definition none of whose inputs carries its var axis: calls cannot be keyed.
    path = next((root / "definitions").rglob("*.json"))
    doc = json.loads(path.read_text())
    doc["inputs"]["x"]["shape"] = ["h", "h"]
    path.write_text(json.dumps(doc))
    table = build_table(root)
    assert table["definitions"] == {}
    message = select.unused_message(root, table)
    assert message == (
        f"fibgen: {root}: nothing is routed: 1 solution file(s), 5 evaluated trace(s): "
        "1 solution(s) failed at some var-axis keys, so serve only the others, and their "
        "definition cannot be routed per key (scale_h64/small_fast: a var axis of its "
        "definition is in no input's shape)"
    )


# ---------------------------------------------------------------------------------------
# Trace files as flashinfer-bench writes them (Note [reading traces] in select_table.py)


def _raw_line(solution: str, n: int, status: str, abs_err, rel_err, latency=1.0) -> str:
    evaluation = {
        "status": status,
        "environment": {"hardware": "cpu"},
        "timestamp": "2026-01-01T00:00:00",
        "correctness": {"max_relative_error": rel_err, "max_absolute_error": abs_err},
    }
    if status == "PASSED":
        evaluation["performance"] = {
            "latency_ms": latency,
            "reference_latency_ms": 10.0,
            "speedup_factor": 10.0 / latency,
        }
    workload = {"uuid": f"n{n}", "axes": {"n": n}, "inputs": {}}
    trace = {"definition": DEFINITION["name"], "workload": workload, "solution": solution}
    return json.dumps({**trace, "evaluation": evaluation})


def _raw_dataset(root, lines: list[str]):
    from fibgen.format import write_solution

    make_dataset(root, [])
    for name in FILLS:
        write_solution(root, _solution(name), "scale")
    path = root / "traces" / "scale" / f"{DEFINITION['name']}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.slow
def test_non_finite_errors_read_in_either_spelling(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    lines = [
        _raw_line("steady", 3, "PASSED", 1e-3, 1e-3, latency=2.0),
        # Faster, and PASSED, with errors no tolerance admits: flashinfer-bench's strings, a
        # bare NaN (Python's json writes it) and a negative infinity.
        _raw_line("small_fast", 3, "PASSED", "NaN", "NaN", latency=0.5),
        _raw_line("large_fast", 3, "PASSED", "Infinity", 1e-3, latency=0.6),
        _raw_line("broken_fast", 3, "PASSED", float("nan"), "-Infinity", latency=0.7),
        # What flashinfer-bench's evaluator writes for an output holding inf or NaN.
        _raw_line("broken_fast", 17, "INCORRECT_NUMERICAL", "Infinity", "Infinity"),
        _raw_line("large_fast", 17, "INCORRECT_NUMERICAL", "NaN", "NaN"),
    ]
    root = _raw_dataset(tmp_path / "ds", lines)
    assert '"NaN"' in (root / "traces" / "scale" / f"{DEFINITION['name']}.jsonl").read_text()
    with pytest.warns(RuntimeWarning) as caught:
        enable_apply(root, {"*": {"atol": 1e-2}})
    try:
        (message,) = [str(w.message) for w in caught]
        assert (
            "3 solution(s) exceed the policy's atol/rtol (scale_h64/broken_fast, "
            "scale_h64/large_fast, scale_h64/small_fast)"
        ) in message
        assert _call(3) == FILLS["steady"]
    finally:
        disable_apply()
    # Without tolerances any PASSED trace counts, whatever errors it reports.
    info = build_table(root)["definitions"][DEFINITION["name"]]
    assert info["ranking"] == ["small_fast", "steady"] and "keyed" not in info


@pytest.mark.slow
def test_lines_that_are_not_traces_are_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    good = json.loads(_raw_line("steady", 3, "PASSED", 1e-3, 1e-3))
    odd = []
    for path, value in (
        (("workload", "axes"), {"n": "3"}),  # an axis value that is no whole number
        (("workload", "axes"), None),
        (("workload",), {"uuid": "m3", "axes": {"m": 3}, "inputs": {}}),  # another axis
        (("solution",), 7),
    ):
        doc = json.loads(json.dumps(good))
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        odd.append(json.dumps(doc))
    # Errors that are no numbers: unknown, which no tolerance admits.
    unknown_errors = json.loads(_raw_line("large_fast", 3, "PASSED", 1e-3, 1e-3, latency=0.1))
    unknown_errors["evaluation"]["correctness"] = [1e-3]
    # Timings that are no numbers: unknown, so never the fastest.
    unknown_timing = json.loads(_raw_line("small_fast", 3, "PASSED", 1e-3, 1e-3, latency=0.1))
    unknown_timing["evaluation"]["performance"] = {"latency_ms": None, "speedup_factor": "NaN"}
    lines = [
        "not json",
        "[1, 2]",
        *odd,
        json.dumps(unknown_errors),
        json.dumps(unknown_timing),
        json.dumps(good),
        # A workload trace, as tracing and flashinfer-bench write them: not an evaluation.
        json.dumps({**good, "solution": None, "evaluation": None}),
    ]
    root = _raw_dataset(tmp_path / "ds", lines)
    (root / "traces" / "scale" / "binary.jsonl").write_bytes(b"\xff\xfe\x00{\n")
    with pytest.warns(RuntimeWarning) as caught:
        enable_apply(root, {"*": {"atol": 1e-2}})
    try:
        (message,) = [str(w.message) for w in caught]
        assert (
            f"7 line(s) under {root}/traces are not traces and were skipped (`fibgen validate "
            f"{root}` names them)"
        ) in message
        assert "1 solution(s) exceed the policy's atol/rtol (scale_h64/large_fast)" in message
        assert _call(3) == FILLS["steady"]
    finally:
        disable_apply()


def test_solutions_of_languages_fibgen_cannot_run_are_not_selected(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [])
    from fibgen.format import write_solution

    write_solution(root, _cuda_solution("fast_cu"), "scale")
    write_solution(root, _cuda_solution("fast_tl", language="tilelang"), "scale")
    # A language a newer writer adds: fibgen's format does not know it either.
    path = write_solution(root, _cuda_solution("fast_new"), "scale")
    doc = json.loads(path.read_text())
    doc["spec"]["language"] = "cute_dsl"
    path.write_text(json.dumps(doc))
    append_traces(
        root,
        "scale",
        [_on(_trace(s, 3, latency), "NVIDIA H100")
         for s, latency in (("fast_cu", 0.01), ("fast_tl", 0.001), ("fast_new", 0.001))],
    )  # fmt: skip
    table = build_table(root, where=H100)
    assert table["definitions"][DEFINITION["name"]]["ranking"] == ["fast_cu"]
    assert table["unused"]["not_here"] == [
        "scale_h64/fast_new: fibgen cannot build or import cute_dsl solutions",
        "scale_h64/fast_tl: fibgen cannot build or import tilelang solutions",
    ]


# The API's own function as a candidate (Note [the API's own function as a candidate]).


def _own_traces(root, own3, own17):
    """steady, the only trusted solution, at n=3 and n=17; the API's own figures beside it."""
    append_traces(
        root,
        "scale",
        [
            _trace("steady", 3, 1.0, e2e=2.0, own=own3),
            _trace("steady", 17, 4.0, e2e=5.0, own=own17),
        ],
    )


@pytest.fixture()
def steady_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset(tmp_path / "ds", [])
    from fibgen.format import write_solution

    write_solution(root, _solution("steady"), "scale")
    yield root
    disable_apply()


def test_a_key_goes_to_the_faster_call_in_its_own_process_not_the_lower_latency(steady_only):
    # Each solution is timed in a process of its own, beside the reference: at n=3 "steady"
    # ran in a process where everything cost twice as much (the reference 40 against 20), so
    # its 6.0 stands for 3.0 where "large_fast" read 5.0. Per key, as across keys, the ratio
    # to the reference timed in the same rounds decides (Note [selection beside
    # flashinfer-bench]); at n=17 both processes ran alike.
    from fibgen.format import write_solution

    write_solution(steady_only, _solution("large_fast"), "scale")
    append_traces(
        steady_only,
        "scale",
        [
            _trace("steady", 3, 1.0, e2e=6.0, ref_e2e=40.0),
            _trace("large_fast", 3, 1.0, e2e=5.0, ref_e2e=20.0),
            _trace("steady", 17, 1.0, e2e=6.0, ref_e2e=20.0),
            _trace("large_fast", 17, 1.0, e2e=5.0, ref_e2e=20.0),
        ],
    )
    table = build_table(steady_only)["definitions"][DEFINITION["name"]]
    assert table["keyed"]["keys"] == [[[3], "steady"], [[17], "large_fast"]]


@pytest.mark.slow
def test_a_key_where_the_apis_own_function_is_faster_goes_to_it(steady_only):
    # At n=3 the API's own call costs 1.5 against steady's 2.0 (e2e): that key stays on the
    # API; at n=17 steady wins by more (5.0 against 8.0).
    _own_traces(steady_only, own3=(0.5, 1.5), own17=(5.0, 8.0))
    table = build_table(steady_only)["definitions"][DEFINITION["name"]]
    assert table["keyed"]["keys"] == [[[3], select.ORIGINAL], [[17], "steady"]]
    assert "miss_original" not in table  # steady beats it across its traces (geomean)
    enable_apply(steady_only)
    originals = []

    @apply(DEFINITION["name"])
    def scale(x, w):
        originals.append(x.shape[0])
        return x * w

    w = torch.full((64,), 2.0)
    for n in (3, 17, 5):
        scale(x=torch.randn(n, 64), w=w)
    # n=3 is the API's own; n=17 steady's (a fill); n=5, untraced, the best: steady's.
    assert originals == [3]
    (counts,) = [c for label, c in stats().items() if label.endswith("scale")]
    assert (counts["hit"], counts["fallback_declined"]) == (2, 1)


def test_the_gpu_metric_compares_the_apis_kernel_time(steady_only):
    _own_traces(steady_only, own3=(0.5, 1.5), own17=(5.0, 8.0))
    table = build_table(steady_only, {"*": {"metric": "gpu"}})["definitions"][DEFINITION["name"]]
    # GPU time: 1.0 against 0.5 at n=3 (the API wins), 4.0 against 5.0 at n=17.
    assert table["keyed"]["keys"] == [[[3], select.ORIGINAL], [[17], "steady"]]


def test_without_the_api_as_a_candidate_the_fastest_solution_is_routed(steady_only):
    # Hand-written code whose fallback is not FlashInfer's call: its solutions are ranked as
    # flashinfer-bench ranks them, though the API's own function beat them all.
    _own_traces(steady_only, own3=(0.5, 1.5), own17=(2.0, 3.0))
    config = {DEFINITION["name"]: {"original": False}}
    table = build_table(steady_only, config)["definitions"][DEFINITION["name"]]
    assert table["ranking"] == ["steady"] and "keyed" not in table
    assert "miss_original" not in table


def test_flashinfer_bench_settings_are_said_as_fibgens():
    from fibgen.runtime.errors import ApplyConfigError
    from fibgen.runtime.selection.policy import normalize_config

    with pytest.raises(ApplyConfigError, match=r"max_atol and max_rtol -> atol and rtol"):
        normalize_config({"*": {"max_atol": 1e-2}})

    class ApplyConfig:  # flashinfer-bench's, as far as the message needs
        max_atol = 1e-2

    with pytest.raises(ApplyConfigError, match=r"not ApplyConfig; flashinfer-bench's Apply"):
        normalize_config(ApplyConfig())


def test_flashinfer_benchs_own_config_objects_are_said_as_fibgens():
    require_flashinfer_bench()
    from flashinfer_bench.apply.config import ApplyConfig, ApplyConfigRegistry

    from fibgen.runtime.errors import ApplyConfigError
    from fibgen.runtime.selection.policy import normalize_config

    for config in (ApplyConfig(), ApplyConfigRegistry(default=ApplyConfig())):
        with pytest.raises(ApplyConfigError, match=r"on_miss_policy 'fallback_only' -> on_miss"):
            normalize_config(config)


def test_the_original_key_takes_true_or_false_only():
    from fibgen.runtime.errors import ApplyConfigError
    from fibgen.runtime.selection.policy import normalize_config

    with pytest.raises(ApplyConfigError, match="original must be True or False, not 'no'"):
        normalize_config({"*": {"original": "no"}})


def test_a_definition_no_solution_beats_the_api_on_is_not_routed_and_said(steady_only):
    _own_traces(steady_only, own3=(0.5, 1.5), own17=(2.0, 3.0))
    table = build_table(steady_only)
    assert DEFINITION["name"] not in table["definitions"]
    assert table["unused"]["slower"] == [f"{DEFINITION['name']} (cpu)"]
    with pytest.warns(RuntimeWarning, match="no solution faster than the API's own function"):
        assert entries(steady_only) == {}


@pytest.mark.slow
def test_a_miss_goes_to_the_api_where_the_best_loses_to_it_overall(steady_only):
    # steady wins n=17 by a little (5.0 against 5.5) and loses n=3 by a lot (2.0 against
    # 0.5): across its traces it is slower, so an untraced key goes to the API.
    _own_traces(steady_only, own3=(0.2, 0.5), own17=(5.0, 5.5))
    table = build_table(steady_only)["definitions"][DEFINITION["name"]]
    assert table["miss_original"] is True
    assert table["keyed"]["keys"] == [[[3], select.ORIGINAL], [[17], "steady"]]
    enable_apply(steady_only)
    originals = []

    @apply(DEFINITION["name"])
    def scale(x, w):
        originals.append(x.shape[0])
        return x * w

    for n in (3, 17, 8):
        scale(x=torch.randn(n, 64), w=torch.ones(64))
    assert originals == [3, 8]


def test_traces_without_the_apis_figures_rank_solutions_as_before(steady_only):
    append_traces(steady_only, "scale", [_trace("steady", 3, 1.0, e2e=2.0)])
    table = build_table(steady_only)["definitions"][DEFINITION["name"]]
    assert table["ranking"] == ["steady"] and "keyed" not in table


@pytest.mark.parametrize("traced", [False, True], ids=["solutions-folder", "traced-dataset"])
def test_a_definition_file_that_is_not_a_definition_is_said_at_enable(tmp_path, traced):
    root = make_dataset(tmp_path / "ds", ["good_returns"])
    broken = root / "definitions" / "norm" / "mynorm.json"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_text('{"name": "mynorm", "axes": {')  # cut short
    (root / "definitions" / "norm" / "notes.json").write_text('{"name": "notes"}')
    if traced:
        (root / "traces").mkdir()
    with pytest.warns(RuntimeWarning) as said:
        enable_apply(root)
    disable_apply()
    (message,) = [str(w.message) for w in said if "Definition JSON" in str(w.message)]
    assert (
        f"2 file(s) under {root}/definitions are not Definition JSON (definitions/norm/"
        "mynorm.json, definitions/norm/notes.json; `fibgen validate"
    ) in message
    # The dataset's good definition file is not named.
    assert f"{DEFINITION['name']}.json" not in message
