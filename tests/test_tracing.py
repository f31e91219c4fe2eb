"""Tracing through generated dispatchers: records, policies, the memory cap, flush on signals."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fake_flashinfer
import fibgen.runtime as rt
from fake_flashinfer import CALLS
from fake_flashinfer.calls import clean_apply  # noqa: F401  (autouse)
from _shared import foreign_files, python_solution, require_flashinfer_bench
from fake_flashinfer.catalogue import MODULE, generated_package
from fibgen.format import load_definitions, load_workloads, write_definition

generated_package()

from fake_kernels import add_bias, gqa_paged_decode, rmsnorm  # noqa: E402

tracing = importlib.import_module("fibgen.runtime.tracing.tracer")
TESTS = Path(__file__).resolve().parent
ORIGINAL_RMSNORM = fake_flashinfer.norm.rmsnorm


def _records(root: Path, definition: str) -> list:
    return load_workloads(root).get(definition, [])


def _decode_call(batch: int = 2):
    wrapper = fake_flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper()
    indptr = torch.arange(batch + 1, dtype=torch.int32)
    indices = torch.arange(batch, dtype=torch.int32)
    q = torch.randn(batch, 4, 8, dtype=torch.bfloat16)
    cache = (torch.randn(3, 1, 2, 8, dtype=torch.bfloat16),) * 2
    return wrapper, indptr, indices, q, cache


def test_keep_all_records_equal_the_calls(tmp_path):
    w = torch.randn(4096)
    batches = [1, 3, 2, 3]
    rt.enable_tracing(tmp_path)
    for n in batches:
        y = rmsnorm.rmsnorm(torch.randn(n, 4096), w)
        assert y.shape == (n, 4096)
    rmsnorm.rmsnorm(torch.randn(5, 2048), torch.randn(2048))
    assert rt.is_tracing()
    rt.disable_tracing()
    assert CALLS == ["rmsnorm"] * 5  # the original API still ran every call
    records = _records(tmp_path, "rmsnorm_h4096")
    assert [r.axes for r in records] == [{"batch_size": n} for n in batches]
    assert all(r.inputs["hidden_states"].type == "random" for r in records)
    assert len({r.uuid for r in records}) == len(batches)
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h2048")] == [{"batch_size": 5}]
    assert (tmp_path / "workloads" / "rmsnorm" / "rmsnorm_h4096.jsonl").is_file()
    assert rt.tracing_stats() == {
        "recorded": 5,
        "filtered": 0,
        "dropped": 0,
        "written": 5,
        "failed": 0,
        "pending": 0,
        "unknown": 0,
        "mismatched": 0,
        "unplanned": 0,
        "plan_changed": 0,
        "refused": 0,
        "capturing": 0,
        "handwritten": 0,
        "inner": 0,
    }
    # The dataset is complete: each definition's JSON sits beside its workloads.
    assert sorted(load_definitions(tmp_path)) == ["rmsnorm_h2048", "rmsnorm_h4096"]


def test_tracing_off_restores_the_untraced_paths(tmp_path):
    rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))
    direct = rmsnorm._api.direct
    assert direct is ORIGINAL_RMSNORM
    rt.enable_tracing(tmp_path)
    assert rmsnorm._api.direct is None
    rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))
    rt.disable_tracing()
    assert rmsnorm._api.direct is not None and rmsnorm._routes == {}
    rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))
    # The original is looked up again (it may have been replaced meanwhile), then called directly.
    assert rmsnorm._api.direct is direct
    assert len(_records(tmp_path, "rmsnorm_h4096")) == 1


def test_dump_all_stores_a_snapshot_of_each_tensor(tmp_path):
    x, w = torch.randn(2, 4096), torch.randn(4096)
    rt.enable_tracing(tmp_path, dump="all")
    rmsnorm.rmsnorm(x, w)
    expected = x.clone()
    x.add_(1)  # the call returned: later writes must not reach the record
    rt.disable_tracing()
    (record,) = _records(tmp_path, "rmsnorm_h4096")
    spec = record.inputs["hidden_states"]
    assert spec.type == "safetensors" and spec.tensor_key == "hidden_states"
    assert spec.path == record.inputs["weight"].path
    assert spec.path.endswith(f"rmsnorm_h4096/rmsnorm_h4096_{record.uuid}.safetensors")
    blob = load_file(str(tmp_path / spec.path))
    assert torch.equal(blob["hidden_states"], expected) and torch.equal(blob["weight"], w)


@pytest.mark.slow
@pytest.mark.parametrize(
    "dump, stored",
    [
        ("none", set()),
        ("int", {"kv_indptr", "kv_indices"}),
        (["q", "kv_indices"], {"q", "kv_indices"}),
        ("all", {"q", "k_cache", "v_cache", "kv_indptr", "kv_indices"}),
    ],
)
def test_dump_policies_on_a_plan_run_api(tmp_path, dump, stored):
    wrapper, indptr, indices, q, cache = _decode_call()
    rt.enable_tracing(tmp_path, dump=dump)
    # Tracing sees calls through the dispatchers: here apply patches them in and falls back.
    with rt.enable_apply({}):
        wrapper.plan(indptr, indices, None, 4, 2, 8, 1, sm_scale=0.5)
        wrapper.run(q, cache)
    rt.disable_tracing()
    (record,) = _records(tmp_path, "gqa_paged_decode_h4_kv2_d8_ps1")
    assert record.axes == {"batch_size": 2, "num_pages": 3, "len_indptr": 3, "num_kv_indices": 2}
    kinds = {name: spec.type for name, spec in record.inputs.items()}
    assert kinds.pop("sm_scale") == "scalar" and record.inputs["sm_scale"].value == 0.5
    assert {n for n, k in kinds.items() if k == "safetensors"} == stored
    assert {n for n, k in kinds.items() if k == "random"} == set(kinds) - stored
    if stored:
        blob = load_file(str(tmp_path / record.inputs[next(iter(stored))].path))
        assert set(blob) == stored
    if "kv_indptr" in stored:
        assert torch.equal(blob["kv_indptr"], indptr)


def test_a_dump_name_no_recorded_input_has_is_said_when_tracing_stops(tmp_path):
    x, w = torch.randn(2, 4096), torch.randn(4096)
    rt.enable_tracing(tmp_path, dump=["weight", "no_such_input"])
    rmsnorm.rmsnorm(x, w)
    with pytest.warns(RuntimeWarning) as caught:
        rt.disable_tracing()
    (message,) = [str(w.message) for w in caught]
    assert message == (
        "fibgen tracing: dump=['no_such_input', 'weight']: no recorded call had a tensor input "
        "named 'no_such_input', so nothing was dumped for it (the recorded calls' tensor "
        "inputs: hidden_states, weight)"
    )
    (record,) = _records(tmp_path, "rmsnorm_h4096")
    assert record.inputs["weight"].type == "safetensors"
    # Names every recorded call has, or no recorded call at all: nothing to say.
    for dump, call in ((["weight"], True), (["no_such_input"], False)):
        rt.enable_tracing(tmp_path / str(call), dump=dump)
        if call:
            rmsnorm.rmsnorm(x, w)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rt.disable_tracing()


@pytest.mark.slow
def test_solution_routes_are_traced_too(tmp_path):
    seen = []

    def double(hidden_states, weight):
        seen.append(hidden_states.shape[0])
        return hidden_states * 2

    rt.enable_tracing(tmp_path)
    with rt.enable_apply({"rmsnorm_h4096": double}):
        x = torch.randn(3, 4096)
        assert torch.equal(fake_flashinfer.norm.rmsnorm(x, torch.randn(4096)), x * 2)
    # A family without an API: the call runs the reference.
    y = add_bias.add_bias(torch.ones(2, 8), torch.ones(8))
    rt.disable_tracing()
    assert seen == [3] and torch.equal(y, torch.full((2, 8), 2.0))
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h4096")] == [{"batch_size": 3}]
    assert [r.axes for r in _records(tmp_path, "add_bias_h8")] == [{"n": 2}]


def test_calls_of_definitions_that_do_not_exist_are_counted_not_recorded(tmp_path):
    # add_bias declares h=8 only: at 16 its name rule gives add_bias_h16, which has no JSON,
    # no contract and no reference; bench could do nothing with its workloads.
    rt.enable_tracing(tmp_path)
    with pytest.warns(RuntimeWarning, match="called for add_bias_h16, which is not a defin") as w:
        for _ in range(3):
            y = add_bias.add_bias(torch.ones(2, 16), torch.ones(16))
        add_bias.add_bias(torch.ones(2, 8), torch.ones(8))
    rt.disable_tracing()
    assert len([x for x in w if "not a definition" in str(x.message)]) == 1  # reported once
    assert torch.equal(y, torch.full((2, 16), 2.0))  # the call itself still ran
    assert rt.tracing_stats()["unknown"] == 3 and rt.tracing_stats()["written"] == 1
    assert _records(tmp_path, "add_bias_h16") == []
    assert sorted(load_definitions(tmp_path)) == ["add_bias_h8"]
    assert not list((tmp_path / "definitions").rglob("add_bias_h16*"))


def test_a_traced_dataset_benches_with_no_other_file(tmp_path, monkeypatch):
    # Definitions (with their sidecars) beside the workloads: bench needs nothing else.
    from fibgen.bench.runner import BenchOptions, plan
    from fibgen.format import Solution, write_solution

    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    rt.enable_tracing(tmp_path / "ds")
    add_bias.add_bias(torch.ones(2, 8), torch.ones(8))
    rt.disable_tracing()
    write_solution(
        tmp_path / "ds",
        Solution.model_validate(
            {
                "name": "adds",
                "definition": "add_bias_h8",
                "author": "me",
                "spec": {
                    "language": "python",
                    "target_hardware": ["cpu"],
                    "entry_point": "main.py::run",
                    "destination_passing_style": False,
                },
                "sources": [
                    {"path": "main.py", "content": "def run(x, bias):\n    return x + bias\n"}
                ],
            }
        ),
        "add_bias",
    )
    (group,) = plan(tmp_path / "ds", BenchOptions()).groups
    assert group.definition.name == "add_bias_h8" and group.workload.axes == {"n": 2}
    # The sidecar came with the JSON, byte for byte, and bench takes its tolerance.
    written = tmp_path / "ds" / "definitions" / "elementwise" / "add_bias_h8.fibgen"
    source = tracing.definition_file(add_bias._api, "add_bias_h8").with_suffix(".fibgen")
    assert written.read_bytes() == source.read_bytes()
    assert json.loads(written.read_text())["tolerance"] == {"atol": 1e-3, "rtol": 1e-3}
    assert group.tolerance["atol"] == 1e-3 and group.tolerance["rtol"] == 1e-3


@pytest.mark.parametrize(
    "dedup, kept",
    [
        ("all", [1, 2, 1, 3, 2]),
        ("axes", [1, 2, 3]),
        (("first", 2), [1, 2]),
        (("axes", 2), [1, 2, 1, 3, 2]),
        (lambda definition, axes, inputs: axes["batch_size"] % 2, [1, 2]),
    ],
)
def test_dedup_policies(tmp_path, dedup, kept):
    w = torch.randn(4096)
    rt.enable_tracing(tmp_path, dedup=dedup)
    for n in (1, 2, 1, 3, 2):
        rmsnorm.rmsnorm(torch.randn(n, 4096), w)
    rt.disable_tracing()
    assert [r.axes["batch_size"] for r in _records(tmp_path, "rmsnorm_h4096")] == kept
    assert rt.tracing_stats()["filtered"] == 5 - len(kept)


def test_bad_options_are_refused_with_a_reason(tmp_path):
    with pytest.raises(rt.TracingConfigError, match="dump='some'"):
        rt.enable_tracing(tmp_path, dump="some")
    with pytest.raises(rt.TracingConfigError, match="count must be a positive integer"):
        rt.enable_tracing(tmp_path, dedup=("first", 0))
    with pytest.raises(rt.TracingConfigError, match="dedup='newest'"):
        rt.enable_tracing(tmp_path, dedup="newest")
    (tmp_path / "file").write_text("")
    with pytest.raises(rt.TracingConfigError, match="is not a folder"):
        rt.enable_tracing(tmp_path / "file")
    # os.environ.get("X", "") where X is unset: not the current folder.
    with pytest.raises(rt.TracingConfigError, match="the dataset folder is empty"):
        rt.enable_tracing("")
    assert not rt.is_tracing()


@pytest.mark.parametrize(
    "options, why",
    [
        ({"max_pending_bytes": 1000}, "bytes of pending tensors"),
        ({"max_pending_records": 0}, "0 pending records"),
    ],
)
def test_past_the_cap_records_are_dropped_counted_and_warned_once(tmp_path, options, why):
    rt.enable_tracing(tmp_path, dump="all", **options)
    with pytest.warns(RuntimeWarning, match=why) as caught:
        for _ in range(3):
            rmsnorm.rmsnorm(torch.randn(2, 4096), torch.randn(4096))
    assert len(caught) == 1
    # Said at the program's line that called the dispatcher.
    assert caught[0].filename == __file__
    # A small tensor still fits under the byte cap.
    add_bias.add_bias(torch.ones(2, 8), torch.ones(8))
    rt.disable_tracing()
    stats = rt.tracing_stats()
    assert stats["dropped"] == 3 + ("records" in why)
    assert stats["recorded"] == stats["written"] == (0 if "records" in why else 1)
    assert _records(tmp_path, "rmsnorm_h4096") == []


@pytest.mark.slow
def test_flashinfer_bench_loads_the_records(tmp_path):
    fib = require_flashinfer_bench()
    from fibgen.codegen.definition_json import definition_dict
    from fibgen.format import Definition

    for defn in MODULE.definitions:
        write_definition(tmp_path, Definition.model_validate(definition_dict(defn)))
    wrapper, indptr, indices, q, cache = _decode_call()
    rt.enable_tracing(tmp_path, dump="int")
    with rt.enable_apply({}):
        rmsnorm.rmsnorm(torch.randn(2, 4096), torch.randn(4096))
        wrapper.plan(indptr, indices, None, 4, 2, 8, 1, sm_scale=0.5)
        wrapper.run(q, cache)
    rt.disable_tracing()
    trace_set = fib.TraceSet.from_path(str(tmp_path))
    loaded = {name: len(ws) for name, ws in trace_set.workloads.items() if ws}
    assert loaded == {"rmsnorm_h4096": 1, "gqa_paged_decode_h4_kv2_d8_ps1": 1}


_CHILD = """
import os, signal, sys, time
import torch
from fake_flashinfer.catalogue import generated_package
generated_package()
import fibgen.runtime as rt
from fake_kernels import rmsnorm
if sys.argv[2] == "custom":
    def handler(signum, frame):
        open(os.path.join(sys.argv[1], "handled"), "w").close()
        sys.exit(3)
    signal.signal(signal.SIGTERM, handler)
rt.enable_tracing(sys.argv[1], dump="all")
for n in range(1, 41):
    rmsnorm.rmsnorm(torch.full((n % 5 + 1, 4096), float(n)), torch.ones(4096))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("previous", ["default", "custom"])
def test_sigterm_flushes_every_record(tmp_path, previous):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
    # The child's stderr goes to a file: a pipe nobody reads until the child exits would
    # block a child that writes more than the pipe holds, and the wait would time out.
    err = tmp_path / "child.stderr"
    with err.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_CHILD), str(tmp_path), previous],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            env=env,
        )
    try:
        assert child.stdout.readline().strip() == "ready", err.read_text()[-3000:]
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 60 s after SIGTERM; its stderr: {err.read_text()[-3000:]}")
    finally:
        child.kill()
        child.stdout.close()
    # Our handler flushed, then chained: to the default action, or to the one it replaced.
    if previous == "default":
        assert child.returncode == -signal.SIGTERM
    else:
        assert child.returncode == 3 and (tmp_path / "handled").exists()
    records = _records(tmp_path, "rmsnorm_h4096")
    assert [r.axes["batch_size"] for r in records] == [n % 5 + 1 for n in range(1, 41)]
    for n, record in enumerate(records, start=1):
        blob = load_file(str(tmp_path / record.inputs["hidden_states"].path))
        assert torch.equal(blob["hidden_states"], torch.full((n % 5 + 1, 4096), float(n)))


def _import_runtime(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "import fibgen.runtime as rt; print(rt.is_tracing())"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=120,
    )


@pytest.mark.slow
def test_environment_enables_tracing_or_warns(tmp_path):
    ok = _import_runtime({"FIBGEN_TRACE": "1", "FIBGEN_DATASET_PATH": str(tmp_path)})
    assert ok.stdout.strip() == "True", ok.stderr
    missing = _import_runtime({"FIBGEN_TRACE": "1", "FIBGEN_DATASET_PATH": ""})
    assert missing.stdout.strip() == "False"
    assert "FIBGEN_TRACE=1 needs FIBGEN_DATASET_PATH" in missing.stderr
    bad = _import_runtime(
        {"FIBGEN_TRACE": "1", "FIBGEN_DATASET_PATH": str(tmp_path), "FIBGEN_TRACE_DUMP": "x,"}
    )
    assert bad.stdout.strip() == "True"  # a list of names: "x"
    wrong = _import_runtime(
        {"FIBGEN_TRACE": "1", "FIBGEN_DATASET_PATH": str(tmp_path), "FIBGEN_TRACE_DEDUP": "zz"}
    )
    assert wrong.stdout.strip() == "False" and "tracing stays off" in wrong.stderr


def test_records_are_plain_json_lines(tmp_path):
    rt.enable_tracing(tmp_path)
    rmsnorm.rmsnorm(torch.randn(1, 4096), torch.randn(4096))
    rt.flush_tracing()
    line = (tmp_path / "workloads" / "rmsnorm" / "rmsnorm_h4096.jsonl").read_text()
    obj = json.loads(line)
    assert obj["solution"] is None and obj["evaluation"] is None
    assert obj["definition"] == "rmsnorm_h4096"
    assert obj["workload"]["inputs"] == {
        "hidden_states": {"type": "random"},
        "weight": {"type": "random"},
    }


@pytest.mark.slow
def test_patching_traces_calls_that_bypass_fibgen(tmp_path):
    original = fake_flashinfer.norm.rmsnorm
    x, w = torch.randn(2, 4096), torch.randn(4096)
    # Without patching, a program calling the API itself is not seen.
    rt.enable_tracing(tmp_path / "plain")
    fake_flashinfer.norm.rmsnorm(x, w)
    rt.disable_tracing()
    assert _records(tmp_path / "plain", "rmsnorm_h4096") == []

    rt.enable_tracing(tmp_path / "patched", patch=True)
    assert fake_flashinfer.norm.rmsnorm is rmsnorm.rmsnorm
    y = fake_flashinfer.norm.rmsnorm(x, w)
    assert torch.equal(y, original(x, w))  # the original API ran
    # Apply turned on and off meanwhile: the API stays patched for tracing.
    with rt.enable_apply({}):
        pass
    assert fake_flashinfer.norm.rmsnorm is rmsnorm.rmsnorm
    fake_flashinfer.norm.rmsnorm(torch.randn(5, 4096), w)
    rt.disable_tracing()
    assert fake_flashinfer.norm.rmsnorm is original
    # Unpatched call, patched call, the check's own call, patched call again.
    assert CALLS == ["rmsnorm"] * 4
    records = _records(tmp_path / "patched", "rmsnorm_h4096")
    assert [r.axes for r in records] == [{"batch_size": 2}, {"batch_size": 5}]


_PROGRAM = """
import flashinfer, torch
import fibgen.runtime  # all that FIBGEN_TRACE=1 needs: the program never calls fibgen
x = torch.randn(3, 4096, dtype=torch.bfloat16)
y = flashinfer.norm.rmsnorm(x, torch.ones(4096, dtype=torch.bfloat16))
print(flashinfer.norm.rmsnorm.__module__, tuple(y.shape))
"""

_FLASHINFER_NORM = """
import torch

def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    rms = torch.rsqrt(input.float().square().mean(-1, keepdim=True) + eps)
    return (input.float() * rms * weight.float()).to(input.dtype)
"""


@pytest.mark.slow
def test_environment_switch_traces_a_program_that_calls_flashinfer(tmp_path):
    # A stand-in `flashinfer` package, reached by the catalogue's generated dispatchers.
    package = tmp_path / "site" / "flashinfer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from . import norm\n")
    (package / "norm.py").write_text(_FLASHINFER_NORM)
    env = {
        "FIBGEN_TRACE": "1",
        "FIBGEN_DATASET_PATH": str(tmp_path / "ds"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-c", _PROGRAM],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=120,
    )
    assert run.stdout.split() == ["fibgen_kernels.rmsnorm", "(3,", "4096)"], run.stderr
    records = _records(tmp_path / "ds", "rmsnorm_h4096")
    assert [r.axes for r in records] == [{"batch_size": 3}]


@pytest.mark.parametrize(
    "hidden, weight, reason",
    [
        (
            torch.randn(2, 3, 4096),
            torch.randn(4096),
            "input hidden_states has 3 dims, the definition's has 2 [batch_size, hidden_size]",
        ),
        (
            torch.randn(2, 4096, dtype=torch.float64),
            torch.randn(4096),
            "input hidden_states is float64, the definition's is float32",
        ),
        (
            torch.randn(2, 4096),
            torch.randn(1),
            "input weight has size 1 along axis hidden_size (dim 0), the definition's is 4096",
        ),
    ],
    ids=["rank", "dtype", "const size"],
)
def test_calls_that_do_not_match_their_definition_are_counted_not_recorded(
    tmp_path, monkeypatch, hidden, weight, reason
):
    # The definition JSON the tracer finds beside the dispatcher (the fake catalogue's JSON
    # has no tensors: without one the dispatcher's table checks dtypes and ranks only).
    definition = tmp_path / "def" / "rmsnorm" / "rmsnorm_h4096.json"
    definition.parent.mkdir(parents=True)
    tensor = {"dtype": "float32"}
    definition.write_text(
        json.dumps(
            {
                "name": "rmsnorm_h4096",
                "op_type": "rmsnorm",
                "axes": {
                    "batch_size": {"type": "var"},
                    "hidden_size": {"type": "const", "value": 4096},
                },
                "inputs": {
                    "hidden_states": {**tensor, "shape": ["batch_size", "hidden_size"]},
                    "weight": {**tensor, "shape": ["hidden_size"]},
                },
                "outputs": {"output": {**tensor, "shape": ["batch_size", "hidden_size"]}},
                "reference": "def run(hidden_states, weight):\n    return hidden_states\n",
            }
        )
    )
    monkeypatch.setattr(tracing, "definition_file", lambda api, name: definition)
    rt.enable_tracing(tmp_path / "ds")
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(3):
            rmsnorm.rmsnorm(hidden, weight)  # the call itself still runs
        rmsnorm.rmsnorm(torch.randn(5, 4096), torch.randn(4096))
    rt.disable_tracing()
    assert [str(w.message) for w in caught] == [
        f"fibgen tracing: a call of rmsnorm_h4096 does not match its definition: {reason}; "
        "such calls are not recorded, and tracing_stats()['mismatched'] counts them"
    ]
    assert CALLS == ["rmsnorm"] * 4
    stats = rt.tracing_stats()
    assert (stats["mismatched"], stats["recorded"], stats["failed"]) == (3, 1, 0)
    assert [r.axes for r in _records(tmp_path / "ds", "rmsnorm_h4096")] == [{"batch_size": 5}]


# Another writer of the dataset, killed in the middle of a line: half a record, no newline.
_TEAR = """
import os, signal, sys
line = open(sys.argv[1], "rb").read().splitlines()[0]
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
os.write(fd, line[: len(line) // 2])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_record_after_another_processs_torn_line_survives(tmp_path):
    from fibgen.format import FormatWarning

    path = tmp_path / "workloads" / "rmsnorm" / "rmsnorm_h4096.jsonl"
    rt.enable_tracing(tmp_path)
    rmsnorm.rmsnorm(torch.randn(2, 4096), torch.randn(4096))
    rt.flush_tracing()
    # The tracer has written this file already when the other process tears its last line.
    died = subprocess.run([sys.executable, "-c", _TEAR, str(path)], timeout=60)
    assert died.returncode == -signal.SIGKILL
    torn = path.read_bytes().splitlines()[-1]
    assert not path.read_bytes().endswith(b"\n") and len(torn) > 100
    with pytest.warns(RuntimeWarning) as caught:
        rmsnorm.rmsnorm(torch.randn(3, 4096), torch.randn(4096))
        rt.disable_tracing()
    assert [str(w.message) for w in caught] == [
        f"fibgen tracing: {path} did not end with a newline (a writer stopped mid-line?); new "
        "records start on a line of their own"
    ]
    assert path.read_bytes().splitlines()[1] == torn
    # Readers skip the torn fragment, say where it is, and keep both records.
    with pytest.warns(FormatWarning) as read:
        assert [r.axes for r in _records(tmp_path, "rmsnorm_h4096")] == [
            {"batch_size": 2},
            {"batch_size": 3},
        ]
    assert [str(w.message) for w in read] == [
        f"{path}:2: skipped: not JSON ({len(torn)} bytes; a line torn by a writer stopped "
        "before finishing it?)"
    ]


def test_a_var_axis_of_two_sizes_is_a_mismatch(tmp_path):
    from fake_kernels import fused_add_rmsnorm

    rt.enable_tracing(tmp_path)
    with pytest.warns(RuntimeWarning) as caught, pytest.raises(RuntimeError, match="broadcast"):
        # Recorded (here: refused) before FlashInfer's function fails on it.
        fused_add_rmsnorm.fused_add_rmsnorm(
            torch.randn(1, 4096), torch.randn(3, 4096), torch.randn(4096)
        )
    rt.disable_tracing()
    assert [str(w.message) for w in caught] == [
        "fibgen tracing: a call of fused_add_rmsnorm_h4096 does not match its definition: "
        "input residual has size 3 along axis batch_size (dim 0), expected 1 as in "
        "hidden_states (dim 0); such calls are not recorded, and "
        "tracing_stats()['mismatched'] counts them"
    ]
    assert rt.tracing_stats()["mismatched"] == 1
    assert _records(tmp_path, "fused_add_rmsnorm_h4096") == []


def test_records_after_a_torn_line_start_on_a_line_of_their_own(tmp_path):
    rt.enable_tracing(tmp_path)
    rmsnorm.rmsnorm(torch.randn(2, 4096), torch.randn(4096))
    rt.disable_tracing()
    path = tmp_path / "workloads" / "rmsnorm" / "rmsnorm_h4096.jsonl"
    whole = path.read_text()
    path.write_text(whole + whole[:50])  # a process killed in the middle of a line
    rt.enable_tracing(tmp_path)
    with pytest.warns(RuntimeWarning) as caught:
        rmsnorm.rmsnorm(torch.randn(3, 4096), torch.randn(4096))
        rt.flush_tracing()
        rmsnorm.rmsnorm(torch.randn(4, 4096), torch.randn(4096))
        rt.disable_tracing()
    assert [str(w.message) for w in caught] == [
        f"fibgen tracing: {path} did not end with a newline (a writer stopped mid-line?); new "
        "records start on a line of their own"
    ]
    lines = path.read_text().splitlines()
    assert lines[:2] == [whole.strip(), whole[:50]]
    assert [json.loads(line)["workload"]["axes"] for line in lines[2:]] == [
        {"batch_size": 3},
        {"batch_size": 4},
    ]


def test_runs_of_a_wrapper_planned_before_tracing_are_counted_and_said_once(tmp_path):
    # An engine plans its wrappers, then tracing is turned on: the runs that follow have no
    # plan() that tracing saw, so their plan-time inputs are unknown and nothing is recorded;
    # each is counted, and the first says what to do (Note [missed calls]).
    wrapper, indptr, indices, q, cache = _decode_call()
    wrapper.plan(indptr, indices, None, 4, 2, 8, 1, sm_scale=0.5)
    rt.enable_tracing(tmp_path, patch=True)
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(24):
            wrapper.run(q, cache)
    assert CALLS.count("run") == 24  # every call still ran FlashInfer's run()
    assert [str(w.message) for w in caught] == [
        "fibgen tracing: a call of fake_flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"
        ".run() on a wrapper whose plan() tracing did not see (planned before enable_tracing, "
        "or before apply was last turned on or off) is not recorded: its plan-time inputs are "
        "unknown; tracing_stats()['unplanned'] counts them. To record its runs, call plan() "
        "again after enable_tracing (FIBGEN_TRACE=1 traces from the start)"
    ]
    assert (rt.tracing_stats()["unplanned"], rt.tracing_stats()["recorded"]) == (24, 0)
    # Planned again while tracing: its runs are recorded.
    wrapper.plan(indptr, indices, None, 4, 2, 8, 1, sm_scale=0.5)
    wrapper.run(q, cache)
    rt.disable_tracing()
    stats = rt.tracing_stats()
    assert (stats["unplanned"], stats["recorded"], stats["written"]) == (24, 1, 1)
    assert len(_records(tmp_path, "gqa_paged_decode_h4_kv2_d8_ps1")) == 1


@pytest.mark.slow
def test_tracing_leaves_nothing_in_the_dataset_but_its_files(tmp_path, monkeypatch):
    # Workloads, blobs, definitions and their sidecars, and nothing else: also where a blob
    # could not be put in place (a full disk), whose record is counted as failed.
    wrapper, indptr, indices, q, cache = _decode_call()
    rt.enable_tracing(tmp_path, dump="all")
    rmsnorm.rmsnorm(torch.randn(2, 4096), torch.randn(4096))
    with rt.enable_apply({}):
        wrapper.plan(indptr, indices, None, 4, 2, 8, 1, sm_scale=0.5)
        wrapper.run(q, cache)
    rt.flush_tracing()
    replace = os.replace

    def disk_full(source, target, *args, **kwargs):
        if str(target).endswith(".safetensors"):
            raise OSError(28, "No space left on device")
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", disk_full)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rmsnorm.rmsnorm(torch.randn(3, 4096), torch.randn(4096))
        rt.flush_tracing()
    monkeypatch.setattr(os, "replace", replace)
    rt.disable_tracing()
    stats = rt.tracing_stats()
    assert (stats["written"], stats["failed"]) == (2, 1)
    assert len(list(tmp_path.glob("blob/workloads/*/*/*.safetensors"))) == 2
    assert foreign_files(tmp_path) == []


@pytest.mark.slow
def test_calls_whose_tensors_apply_refuses_are_mismatched_as_with_apply_off(tmp_path):
    # The dispatcher's check of the tensors refuses them before tracing sees them; they are
    # counted and said as the tracer's own check says them (Note [missed calls]).
    rt.enable_tracing(tmp_path)
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states * 2}):
        with pytest.warns(RuntimeWarning) as caught:
            for _ in range(2):
                rmsnorm.rmsnorm(torch.randn(2, 4096, dtype=torch.float64), torch.randn(4096))
        rmsnorm.rmsnorm(torch.randn(3, 4096), torch.randn(4096))
    rt.disable_tracing()
    assert [str(w.message) for w in caught] == [
        "fibgen tracing: a call of rmsnorm_h4096 does not match its definition: input "
        "hidden_states is float64, the definition's is float32; such calls are not recorded, "
        "and tracing_stats()['mismatched'] counts them"
    ]
    stats = rt.tracing_stats()
    assert (stats["mismatched"], stats["refused"], stats["recorded"]) == (2, 0, 1)
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h4096")] == [{"batch_size": 3}]


def _traced_failing_calls(
    tmp_path, call, *, patch: bool = True, times: int = 1
) -> tuple[list[str], dict]:
    """Tracing's warnings and counts for ``call``, made ``times`` with tracing and apply on
    (a solution for rmsnorm_h4096), where it reaches FlashInfer's own function, which raises
    on this CPU."""
    rt.enable_tracing(tmp_path, patch=patch)
    with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states}):
        with pytest.warns(RuntimeWarning) as caught:
            for _ in range(times):
                with pytest.raises(Exception):  # noqa: B017 - FlashInfer's CPU error
                    call()
    rt.disable_tracing()
    return [str(w.message) for w in caught if "tracing" in str(w.message)], rt.tracing_stats()


@pytest.mark.slow
def test_a_call_of_the_real_api_whose_tensors_apply_refuses_is_mismatched(tmp_path):
    # The same as above through FlashInfer's own patched function (on this CPU, its kernel
    # then raises): a weight of another size than the input's hidden size.
    from _shared import require_module

    require_module("flashinfer", "flashinfer is not installed")
    import flashinfer

    x, w = torch.randn(4, 4096, dtype=torch.bfloat16), torch.randn(2048, dtype=torch.bfloat16)
    messages, stats = _traced_failing_calls(tmp_path, lambda: flashinfer.norm.rmsnorm(x, w, 1e-5))
    assert messages == [
        "fibgen tracing: a call of rmsnorm_h4096 does not match its definition: input weight "
        "has size 2048 along axis hidden_size (dim 0), expected 4096 as in hidden_states (dim "
        "1); such calls are not recorded, and tracing_stats()['mismatched'] counts them"
    ]
    assert (stats["mismatched"], stats["refused"], stats["recorded"]) == (1, 0, 0)


@pytest.mark.slow
def test_calls_a_rule_refuses_are_counted_not_recorded(tmp_path):
    # Another eps than the definition's: routed to the original API (FlashInfer's, which
    # cannot run on this CPU), not a workload of the definition (Note [missed calls]).
    from _shared import require_module

    require_module("flashinfer", "flashinfer is not installed")
    from fibgen_kernels import rmsnorm as catalogue_rmsnorm

    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    messages, stats = _traced_failing_calls(
        tmp_path, lambda: catalogue_rmsnorm.rmsnorm(x, w, eps=1e-3), patch=False, times=2
    )
    assert messages == [
        "fibgen tracing: a call of flashinfer.norm.rmsnorm for rmsnorm_h4096 is not recorded: "
        "it fails the rule on eps (eps=0.001), so it is not a workload of rmsnorm_h4096; "
        "tracing_stats()['refused'] counts them. To record such calls, declare a definition "
        "(an instance in the .fidef) that they satisfy"
    ]
    assert (stats["refused"], stats["mismatched"], stats["recorded"]) == (2, 0, 0)


# ---------------------------------------------------------------------------------------
# Writes stay inside the dataset (Note [confined paths] in fibgen/fsutil.py)


def _traced_with_warnings(root: Path, dump: str = "none") -> list[str]:
    rt.enable_tracing(root, dump=dump)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (1, 2, 3):
            rmsnorm.rmsnorm(torch.randn(n, 4096), torch.randn(4096))
        rt.disable_tracing()
    return [str(w.message) for w in caught]


def test_a_workload_file_linked_out_of_the_dataset_is_not_written_through(tmp_path):
    root, outside = tmp_path / "ds", tmp_path / "outside.jsonl"
    outside.write_text("")
    link = root / "workloads" / "rmsnorm" / "rmsnorm_h4096.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    messages = _traced_with_warnings(root)
    assert outside.read_text() == ""
    assert link.is_symlink()
    assert rt.tracing_stats()["failed"] == 3 and rt.tracing_stats()["written"] == 0
    assert messages == [
        f"fibgen tracing: cannot write workloads of rmsnorm_h4096: {link}: it is a symbolic "
        f"link to {outside}, outside the dataset {root}; fibgen reads and writes only inside "
        "the dataset (further failures are counted in tracing_stats())"
    ]


def test_a_blob_folder_linked_out_of_the_dataset_gets_no_blob(tmp_path):
    root, outside = tmp_path / "ds", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "blob").symlink_to(outside)
    messages = _traced_with_warnings(root, dump="all")
    assert list(outside.rglob("*")) == []
    assert _records(root, "rmsnorm_h4096") == []
    assert rt.tracing_stats()["failed"] == 3
    (message,) = messages
    assert message.startswith("fibgen tracing: cannot write a workload of rmsnorm_h4096: ")
    assert f"{root / 'blob'} is a symbolic link to {outside}, outside the dataset" in message


def test_links_inside_the_dataset_are_followed(tmp_path):
    root = tmp_path / "ds"
    (root / "store").mkdir(parents=True)
    (root / "blob").symlink_to("store")
    assert _traced_with_warnings(root, dump="all") == []
    assert len(_records(root, "rmsnorm_h4096")) == 3
    assert len(list((root / "store").rglob("*.safetensors"))) == 3


def test_hand_written_calls_are_recorded_as_their_definitions_workloads(tmp_path):
    # As flashinfer-bench's apply records what it routes: every calling form, hit or miss.
    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)

    @rt.apply("rmsnorm_h4096")
    def layer(hidden_states, weight):
        return "fallback"

    solution = lambda hidden_states, weight: hidden_states  # noqa: E731
    with rt.enable_apply({"rmsnorm_h4096": solution, "rmsnorm_h3072": solution}):
        rt.enable_tracing(tmp_path, dump="all")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # nothing is said: every call is recorded
                assert layer(x, w) is x  # a hit
                assert torch.equal(layer(x[:1], weight=w), x[:1])
                assert rt.apply("rmsnorm_h4096", (x,), {"weight": w}, fallback=print) is x
                assert rt.apply("rmsnorm_h4096", (), {"hidden_states": x, "weight": w}) is x
                # A miss, destination-passing.
                y = torch.randn(3, 2048, dtype=torch.bfloat16)
                v = torch.randn(2048, dtype=torch.bfloat16)
                out = torch.empty_like(y)
                rt.apply("rmsnorm_h2048", (y, v, out), fallback=lambda a, b, c: c.copy_(a))
                assert torch.equal(out, y)
            stats = rt.tracing_stats()
        finally:
            rt.disable_tracing()
    assert (stats["recorded"], stats["handwritten"], stats["failed"]) == (5, 0, 0), stats
    records = _records(tmp_path, "rmsnorm_h4096")
    assert [r.axes for r in records] == [{"batch_size": n} for n in (2, 1, 2, 2)]
    for record in records:
        blob = load_file(str(tmp_path / record.inputs["hidden_states"].path))
        assert torch.equal(blob["weight"], w)
        assert torch.equal(blob["hidden_states"], x[: record.axes["batch_size"]])
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h2048")] == [{"batch_size": 3}]
    # The dataset is complete: each definition's JSON beside its workloads.
    assert sorted(load_definitions(tmp_path)) == ["rmsnorm_h2048", "rmsnorm_h4096"]


def test_hand_written_calls_tracing_cannot_record_are_counted_and_said(tmp_path):
    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)

    @rt.apply("rmsnorm_h4096")
    def layer(hidden_states, weight, residual, scale):  # not the definition's inputs
        return hidden_states

    solution = lambda hidden_states, weight: hidden_states  # noqa: E731
    with rt.enable_apply({"rmsnorm_h3072": solution}):
        rt.enable_tracing(tmp_path, dump="none")
        try:
            with pytest.warns(RuntimeWarning) as said:
                assert layer(x, w, x, 2.0) is x
                assert layer(x, w, x, 3.0) is x
                assert rt.apply("no_such_kernel_h7", (x, w), fallback=lambda a, b: 0) == 0
                # Refused by its input check (a name no other test refuses, so that what is
                # said once is said here): not a workload of its definition.
                short = (x[:, :100], w[:100])
                assert rt.apply("rmsnorm_h3072", short, fallback=lambda a, b: 1) == 1
            stats = rt.tracing_stats()
        finally:
            rt.disable_tracing()
    assert (stats["handwritten"], stats["mismatched"], stats["recorded"]) == (3, 1, 0), stats
    messages = [str(w.message) for w in said if "fibgen tracing" in str(w.message)]
    assert len(messages) == 3, messages
    assert "its arguments are not the definition's inputs (called with 4 arguments" in messages[0]
    assert "no definition of no_such_kernel_h7 is in" in messages[1]
    assert messages[2].startswith("fibgen tracing: a call of rmsnorm_h3072 does not match")
    assert load_workloads(tmp_path) == {}


def test_hand_written_calls_of_the_traced_datasets_own_definition(tmp_path):
    # A definition fibgen's catalogue lacks, put in the dataset before tracing; its fp8 input
    # passed as its bytes, as FlashInfer's callers often pass them, is recorded as fp8.
    definition = {
        "name": "scale_fp8_rows",
        "op_type": "scale",
        "axes": {"rows": {"type": "var"}, "cols": {"type": "const", "value": 8}},
        "inputs": {
            "x": {"shape": ["rows", "cols"], "dtype": "float8_e4m3fn"},
            "scale": {"shape": ["rows"], "dtype": "float32"},
        },
        "outputs": {"y": {"shape": ["rows", "cols"], "dtype": "float32"}},
        "reference": "def run(x, scale):\n    return x.float() * scale[:, None]\n",
    }
    folder = tmp_path / "definitions" / "scale"
    folder.mkdir(parents=True)
    (folder / "scale_fp8_rows.json").write_text(json.dumps(definition), encoding="utf-8")
    x = torch.randn(5, 8).to(torch.float8_e4m3fn)
    scale = torch.rand(5)
    rt.enable_tracing(tmp_path, dump="all")
    try:
        got = rt.apply("scale_fp8_rows", (x.view(torch.uint8), scale), fallback=lambda a, s: s)
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert got is scale and (stats["recorded"], stats["handwritten"]) == (1, 0), stats
    (record,) = _records(tmp_path, "scale_fp8_rows")
    assert record.axes == {"rows": 5}
    blob = load_file(str(tmp_path / record.inputs["x"].path))
    assert blob["x"].dtype == torch.float8_e4m3fn and torch.equal(
        blob["x"].view(torch.uint8), x.view(torch.uint8)
    )
    # The dataset's own definition file is kept as it was, not replaced by a copy.
    assert sorted(p.name for p in (tmp_path / "definitions").rglob("*.json")) == [
        "scale_fp8_rows.json"
    ]


def test_a_solution_calling_its_own_hand_written_name_is_recorded_once(tmp_path):
    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)

    def wrapper(hidden_states, weight):  # a FlashInfer-wrapper-like solution: calls the API
        return rt.apply("rmsnorm_h4096", (hidden_states, weight), fallback=lambda a, b: a * 2)

    with rt.enable_apply({"rmsnorm_h4096": wrapper}):
        rt.enable_tracing(tmp_path, dump="none")
        try:
            out = rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b: a)
            counts = rt.stats()["fibgen.runtime.apply('rmsnorm_h4096')"]
            stats = rt.tracing_stats()
        finally:
            rt.disable_tracing()
    assert torch.equal(out, x * 2)  # the inner call ran its fallback, once
    assert (counts["hit"], counts["nested"]) == (1, 1)
    assert stats["recorded"] == 1 and len(_records(tmp_path, "rmsnorm_h4096")) == 1


def _own_definition(root: Path, name: str, inputs: dict, axes: dict, folder: str = "own") -> Path:
    """Put a definition of one's own (one output, ``y``, like the first input) in a dataset."""
    first = next(iter(inputs.values()))
    definition = {
        "name": name,
        "op_type": "own",
        "axes": axes,
        "inputs": inputs,
        "outputs": {"y": {"shape": first["shape"], "dtype": first["dtype"]}},
        "reference": "def run(*args):\n    return args[0]\n",
    }
    path = root / "definitions" / folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(definition), encoding="utf-8")
    return path


def _traced_hand_written(root: Path, calls, **options) -> dict:
    """Make ``calls`` (name, args) through hand-written apply with tracing on; its stats."""
    rt.enable_tracing(root, dump="none", **options)
    try:
        for name, args in calls:
            rt.apply(name, args, fallback=lambda *a: None)
        return rt.tracing_stats()
    finally:
        rt.disable_tracing()


def test_hand_written_calls_that_are_no_workload_of_their_definition_are_mismatched(tmp_path):
    # Required inputs given as None, and scalars that give an axis: any integer (a numpy
    # integer, a 0-d tensor, as generated code reads them) is the axis, but not a negative one
    # or a float.
    np = pytest.importorskip("numpy")
    axes = {"n": {"type": "var"}, "k": {"type": "var"}, "d": {"type": "const", "value": 8}}
    inputs = {
        "x": {"shape": ["n", "d"], "dtype": "float32"},
        "k": {"shape": None, "dtype": "int32"},
        "largest": {"shape": None, "dtype": "bool"},
    }
    _own_definition(tmp_path, "top_k_rows_d8", inputs, axes)
    x = torch.randn(3, 8)
    with pytest.warns(RuntimeWarning, match="input x is None, and the definition does not"):
        stats = _traced_hand_written(
            tmp_path,
            [
                ("top_k_rows_d8", (x, 2, True)),
                ("top_k_rows_d8", (x, np.int64(4), False)),
                ("top_k_rows_d8", (x, torch.tensor(5), torch.tensor(True))),
                ("top_k_rows_d8", (None, 2, True)),
                ("top_k_rows_d8", (x, -1, True)),
                ("top_k_rows_d8", (x, 2.5, True)),
                ("top_k_rows_d8", (x, 2, "yes")),
                ("rmsnorm_h4096", (torch.randn(2, 4096, dtype=torch.bfloat16), None)),
            ],
        )
    assert (stats["recorded"], stats["mismatched"], stats["failed"]) == (3, 5, 0), stats
    records = _records(tmp_path, "top_k_rows_d8")
    assert [r.axes for r in records] == [{"n": 3, "k": k} for k in (2, 4, 5)]
    # Scalars given as 0-d tensors are recorded as their values.
    assert [(r.inputs["k"].value, r.inputs["largest"].value) for r in records] == [
        (2, True),
        (4, False),
        (5, True),
    ]
    assert _records(tmp_path, "rmsnorm_h4096") == []


def test_an_axis_only_a_left_out_optional_input_carries_is_left_out_as_dispatchers_do(tmp_path):
    axes = {"n": {"type": "var"}, "s": {"type": "var"}, "d": {"type": "const", "value": 8}}
    inputs = {
        "x": {"shape": ["n", "d"], "dtype": "float32"},
        "state": {"shape": ["s", "d"], "dtype": "float32", "optional": True},
    }
    _own_definition(tmp_path, "with_state_d8", inputs, axes)
    x = torch.randn(3, 8)
    calls = [("with_state_d8", (x, None)), ("with_state_d8", (x, torch.randn(2, 8)))]
    stats = _traced_hand_written(tmp_path, calls)
    assert (stats["recorded"], stats["failed"]) == (2, 0), stats
    assert [r.axes for r in _records(tmp_path, "with_state_d8")] == [{"n": 3}, {"n": 3, "s": 2}]


def _identity_solution(root: Path, name: str, params: str) -> None:
    """A Python solution of ``name`` that returns its first input, in dataset ``root``."""
    source = f"def run({params}):\n    return {params.split(',')[0]}\n"
    folder = root / "solutions" / name
    folder.mkdir(parents=True)
    solution = python_solution("identity", name, source)
    (folder / "identity.json").write_text(json.dumps(solution), encoding="utf-8")


def test_a_definition_from_a_flat_dataset_is_copied_under_its_op_type(tmp_path):
    routed, traced = tmp_path / "routed", tmp_path / "traced"
    axes = {"n": {"type": "var"}, "d": {"type": "const", "value": 8}}
    _own_definition(
        routed, "flat_def_d8", {"x": {"shape": ["n", "d"], "dtype": "float32"}}, axes, folder="."
    )
    _identity_solution(routed, "flat_def_d8", "x")
    with rt.enable_apply(routed):
        stats = _traced_hand_written(traced, [("flat_def_d8", (torch.randn(3, 8),))])
    assert stats["recorded"] == 1
    assert sorted(p.relative_to(traced).as_posix() for p in traced.rglob("*.json")) == [
        "definitions/own/flat_def_d8.json"
    ]


def test_the_traced_datasets_own_definition_is_the_one_calls_are_recorded_as(tmp_path):
    # Records land beside the traced dataset's definition: a call that is not a workload of
    # it is not recorded, though apply routes it from a dataset whose definition it fits.
    norm = {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 4096}}

    def tensors(dtype):
        return {
            "hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": dtype},
            "weight": {"shape": ["hidden_size"], "dtype": dtype},
        }

    traced, routed = tmp_path / "traced", tmp_path / "routed"
    path = _own_definition(traced, "rmsnorm_h4096", tensors("float16"), norm, folder="rmsnorm")
    _own_definition(routed, "rmsnorm_h4096", tensors("bfloat16"), norm, folder="rmsnorm")
    _identity_solution(routed, "rmsnorm_h4096", "hidden_states, weight")
    bf16 = (torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16))
    with rt.enable_apply(routed):
        with pytest.warns(RuntimeWarning, match="input hidden_states is bfloat16, the defin"):
            stats = _traced_hand_written(traced, [("rmsnorm_h4096", bf16)])
        counts = rt.stats()["fibgen.runtime.apply('rmsnorm_h4096')"]
    assert counts["hit"] == 1  # routed as its dataset says
    assert (stats["recorded"], stats["mismatched"]) == (0, 1), stats
    assert json.loads(path.read_text())["inputs"]["weight"]["dtype"] == "float16"  # kept


def test_a_definition_added_after_tracing_missed_it_is_found_at_the_next_enable(tmp_path):
    x = torch.randn(3, 8)
    inputs = {"x": {"shape": ["n", "d"], "dtype": "float32"}}
    axes = {"n": {"type": "var"}, "d": {"type": "const", "value": 8}}
    with pytest.warns(RuntimeWarning, match="no definition of added_later_d8 is in"):
        stats = _traced_hand_written(tmp_path, [("added_later_d8", (x,))])
    assert (stats["recorded"], stats["handwritten"]) == (0, 1)
    _own_definition(tmp_path, "added_later_d8", inputs, axes)
    stats = _traced_hand_written(tmp_path, [("added_later_d8", (x,))])
    assert (stats["recorded"], stats["handwritten"]) == (1, 0)


def test_a_broken_definition_file_never_breaks_the_call_and_is_named(tmp_path):
    folder = tmp_path / "definitions" / "own"
    folder.mkdir(parents=True)
    broken = {"name": "broken_def_d4", "op_type": "own", "axes": {"n": {"type": "var"}}}
    broken["inputs"] = {"x": {"shape": ["n"], "dtype": "float32"}}  # no outputs, no reference
    (folder / "broken_def_d4.json").write_text(json.dumps(broken), encoding="utf-8")
    rt.enable_tracing(tmp_path, dump="none")
    try:
        with pytest.warns(RuntimeWarning, match="broken_def_d4.json is not a Definition JSON"):
            assert rt.apply("broken_def_d4", (torch.randn(4),), fallback=lambda x: "ran") == "ran"
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert (stats["handwritten"], stats["recorded"], stats["failed"]) == (1, 0, 0)


def test_a_call_inside_a_recorded_hand_written_call_of_its_definition_is_not_recorded_again(
    tmp_path,
):
    # The usual wrapping of FlashInfer's API in a decorated function: the body's call of the
    # API (here a generated dispatcher, and apply of the same name) is the same workload.
    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)

    @rt.apply("rmsnorm_h4096")
    def norm(hidden_states, weight):
        rt.apply("rmsnorm_h4096", (hidden_states, weight), fallback=lambda a, b: a)
        return rmsnorm.rmsnorm(hidden_states, weight)

    @rt.apply("layer_of_no_definition")
    def layer(x, w):  # not recorded itself: the calls inside it are
        return rmsnorm.rmsnorm(torch.randn(1, 2048), torch.randn(2048))

    rt.enable_tracing(tmp_path, dump="none")
    try:
        norm(x, w)
        with pytest.warns(RuntimeWarning, match="no definition of layer_of_no_definition"):
            layer(x, w)
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert (stats["recorded"], stats["inner"], stats["handwritten"]) == (2, 2, 1), stats
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h4096")] == [{"batch_size": 2}]
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h2048")] == [{"batch_size": 1}]


def test_calls_first_made_in_capture_with_apply_on_are_counted(tmp_path, monkeypatch):
    # Their route is decided after capture, so no traced route sees them: they are counted.
    routing = importlib.import_module("fibgen.runtime.routing.api")
    x, w = torch.randn(1, 4096), torch.randn(4096)  # the generated dispatcher's float32
    y, v = torch.randn(1, 2048, dtype=torch.bfloat16), torch.randn(2048, dtype=torch.bfloat16)
    solution = lambda hidden_states, weight: hidden_states  # noqa: E731
    with rt.enable_apply({"rmsnorm_h4096": solution, "rmsnorm_h2048": solution}):
        rt.enable_tracing(tmp_path, dump="none")
        try:
            monkeypatch.setattr(routing, "is_capturing", lambda: True)
            with pytest.warns(RuntimeWarning, match="first made while a CUDA graph is captured"):
                rmsnorm.rmsnorm(x, w)
                rt.apply("rmsnorm_h2048", (y, v), fallback=lambda a, b: a)
            monkeypatch.setattr(routing, "is_capturing", lambda: False)
            rmsnorm.rmsnorm(x, w)  # after capture: routed, and recorded
            stats = rt.tracing_stats()
        finally:
            rt.disable_tracing()
    assert (stats["capturing"], stats["recorded"]) == (2, 1), stats


def test_the_calls_inside_a_hand_written_call_that_is_not_recorded_are_recorded(tmp_path):
    # An engine's method decorated by its definition's name, of another signature: it cannot
    # be recorded, and the dispatcher call inside it is, as before calls of it were recorded.
    @rt.apply("rmsnorm_h4096")
    def forward(module, x, w, eps):
        return rmsnorm.rmsnorm(x, w)

    rt.enable_tracing(tmp_path, dump="none")
    try:
        with pytest.warns(RuntimeWarning, match="its arguments are not the definition's inputs"):
            x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096).bfloat16()
            forward(object(), x, w, 1e-6)
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert (stats["recorded"], stats["handwritten"], stats["inner"]) == (1, 1, 0), stats


def test_a_hand_written_call_of_another_signature_is_not_recorded(tmp_path):
    # rms(x, w, eps) has as many arguments as the definition's destination-passing form: eps
    # is no output buffer, so these are not the definition's arguments.
    @rt.apply("rmsnorm_h4096")
    def rms(x, w, eps=1e-5):
        return x

    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    rt.enable_tracing(tmp_path, dump="none")
    try:
        with pytest.warns(RuntimeWarning, match="output output is a float, not a buffer"):
            rms(x, w, 1e-5)
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert (stats["recorded"], stats["handwritten"]) == (0, 1), stats


def test_the_fallback_of_a_failed_solution_is_the_recorded_call_it_falls_back_for(tmp_path):
    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)

    def broken(hidden_states, weight):
        raise RuntimeError("a broken solution")

    @rt.apply("rmsnorm_h4096")
    def norm(hidden_states, weight):
        return rt.apply("rmsnorm_h4096", (hidden_states, weight), fallback=lambda a, b: a)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the solution's failure, said once
        with rt.enable_apply({"rmsnorm_h4096": broken}):
            rt.enable_tracing(tmp_path, dump="none")
            try:
                assert norm(x, w) is x
                stats = rt.tracing_stats()
            finally:
                rt.disable_tracing()
    assert (stats["recorded"], stats["inner"]) == (1, 1), stats


def test_a_dataset_whose_definitions_cannot_be_read_never_breaks_the_call(tmp_path):
    folder = tmp_path / "definitions" / "own"
    folder.mkdir(parents=True)
    (folder / "gone.json").symlink_to(tmp_path / "nowhere.json")
    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    rt.enable_tracing(tmp_path, dump="none")
    try:
        with pytest.warns(RuntimeWarning, match="the definitions of .* cannot be read"):
            assert rt.apply("rmsnorm_h4096", (x, w), fallback=lambda a, b: a) is x
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert (stats["handwritten"], stats["recorded"]) == (1, 0), stats


def test_lookups_made_again_keep_one_catalogue_definition_object(tmp_path):
    from fibgen.runtime.solutions import loading

    first = loading.find_definition("rmsnorm_h4096", tmp_path)
    loading.forget_unfound()
    assert loading.find_definition("rmsnorm_h4096", tmp_path) is first
    assert loading.find_definition("rmsnorm_h4096") is first


def test_what_hand_written_calls_cannot_record_is_said_once_per_name(tmp_path):
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning) as said:
        _traced_hand_written(tmp_path, [("missing_one_a", (x,)), ("missing_one_b", (x,))] * 2)
    messages = [str(w.message) for w in said if "is not recorded" in str(w.message)]
    assert len(messages) == 2 and "missing_one_a" in messages[0] and "missing_one_b" in messages[1]


def test_a_decorator_resolver_that_returns_no_name_is_said_plainly():
    @rt.apply(lambda x: None)
    def f(x):
        return x

    with pytest.raises(TypeError, match=r"the resolver .*<lambda>' returned None, not a def"):
        f(torch.ones(1))


@pytest.mark.slow
def test_a_decorated_wrapper_of_the_real_patched_api_is_recorded_once(tmp_path):
    # The usual flashinfer-bench integration: an engine's function decorated with its
    # definition's name, whose body calls FlashInfer's (here the real, patched) rmsnorm. Apply
    # off: the body runs, FlashInfer's kernel raises on this CPU after tracing has seen both
    # calls; the decorated call is the record, the patched call inside it is inner.
    from _shared import require_module

    require_module("flashinfer", "flashinfer is not installed")
    import flashinfer

    @rt.apply("rmsnorm_h4096")
    def norm(hidden_states, weight):
        return flashinfer.norm.rmsnorm(hidden_states, weight, 1e-5)

    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    own = flashinfer.norm.rmsnorm
    rt.enable_tracing(tmp_path, patch=True, dump="none")
    try:
        assert flashinfer.norm.rmsnorm is not own  # patched while tracing
        with pytest.raises(Exception) as raised:  # FlashInfer's own kernel, on a CPU
            norm(x, w)
        stats = rt.tracing_stats()
    finally:
        rt.disable_tracing()
    assert "fibgen" not in type(raised.value).__module__
    assert (stats["recorded"], stats["inner"], stats["failed"]) == (1, 1, 0), stats
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h4096")] == [{"batch_size": 2}]


@pytest.mark.slow
def test_a_hand_written_fallback_calling_the_real_patched_api_is_routed_and_traced(tmp_path):
    # A layer with no solution of its own runs the caller's code, which calls FlashInfer's
    # patched rmsnorm: routed to its solution (FlashInfer's own kernel would raise on this
    # CPU) and recorded, not taken as a nested call of the layer.
    from _shared import require_module

    require_module("flashinfer", "flashinfer is not installed")
    import flashinfer

    x, w = torch.randn(2, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)

    def layer(hidden_states, weight):
        return flashinfer.norm.rmsnorm(hidden_states, weight, 1e-5)

    rt.enable_tracing(tmp_path, patch=True, dump="none")
    try:
        with rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states * 2}):
            with pytest.warns(RuntimeWarning, match="apply\\('decoder_layer'\\): no solution"):
                out = rt.apply("decoder_layer", (x, w), fallback=layer)
            counts = rt.stats()
    finally:
        rt.disable_tracing()
    assert torch.equal(out, x * 2)
    inner = counts["flashinfer.norm.rmsnorm"]
    assert (inner["hit"], inner["nested"]) == (1, 0)
    assert counts["fibgen.runtime.apply('decoder_layer')"]["fallback_no_candidate"] == 1
    stats = rt.tracing_stats()
    # The layer's call names no definition: counted, not recorded; its rmsnorm call recorded.
    assert (stats["recorded"], stats["handwritten"]) == (1, 1)
    assert [r.axes for r in _records(tmp_path, "rmsnorm_h4096")] == [{"batch_size": 2}]
