"""A dataset written the way flashinfer-bench 0.1.2 writes one, through validate, bench,
report and apply: its trace depths, blobs through its TraceSet, solutions in its default
form (a tvm-ffi C++ one that runs on the CPU, a tvm-ffi CUDA one compiled where nvcc is),
and keys that a newer writer adds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import fibgen.runtime as rt
from fibgen.cli import main

from _shared import require_flashinfer_bench, require_module

# Slow as a whole: a dataset through validate, bench (its workers), report and apply.
pytestmark = pytest.mark.slow

NAME = "gather_rows_r16_h64"

REFERENCE = "import torch\n\ndef run(table, idx):\n    return table[idx.long()]\n"

PYTHON = "def run(table, idx, y):\n    y.copy_(table[idx.long()])\n"

CPP = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

void Gather(tvm::ffi::TensorView table, tvm::ffi::TensorView idx, tvm::ffi::TensorView y) {
  const float* t = static_cast<const float*>(table.data_ptr());
  const int32_t* i = static_cast<const int32_t*>(idx.data_ptr());
  float* out = static_cast<float*>(y.data_ptr());
  int64_t h = table.size(1);
  for (int64_t n = 0; n < idx.size(0); ++n)
    for (int64_t j = 0; j < h; ++j) out[n * h + j] = t[i[n] * h + j];
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Gather);
"""

CUDA = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

__global__ void GatherKernel(const float* t, const int32_t* i, float* y, int64_t n, int64_t h) {
  int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (k < n * h) y[k] = t[i[k / h] * h + k % h];
}

void Gather(tvm::ffi::TensorView table, tvm::ffi::TensorView idx, tvm::ffi::TensorView y) {
  int64_t n = idx.size(0), h = table.size(1);
  DLDevice dev = y.device();
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(dev.device_type, dev.device_id));
  GatherKernel<<<(n * h + 255) / 256, 256, 0, stream>>>(
      static_cast<const float*>(table.data_ptr()), static_cast<const int32_t*>(idx.data_ptr()),
      static_cast<float*>(y.data_ptr()), n, h);
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Gather);
"""


def _add_key(path: Path, where: tuple[str, ...], key: str, value) -> None:
    """What a newer writer adds: a key this version's models do not have."""
    doc = json.loads(path.read_text())
    target = doc
    for part in where:
        target = target[part]
    target[key] = value
    path.write_text(json.dumps(doc, indent=2))


def _write_dataset(root: Path, fib) -> None:
    from flashinfer_bench.data import save_json_file, save_jsonl_file

    definition = fib.Definition.model_validate(
        {
            "name": NAME,
            "op_type": "gather",
            "axes": {
                "n": {"type": "var"},
                "r": {"type": "const", "value": 16},
                "h": {"type": "const", "value": 64},
            },
            "inputs": {
                "table": {"shape": ["r", "h"], "dtype": "float32"},
                "idx": {"shape": ["n"], "dtype": "int32"},
            },
            "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
            "reference": REFERENCE,
        }
    )
    definition_file = root / "definitions" / "gather" / f"{NAME}.json"
    save_json_file(definition, definition_file)
    _add_key(definition_file, (), "schema_version", 2)

    sources = {
        "gather_py": ("python", "main.py", PYTHON, ["cpu"]),
        "gather_cpp": ("cpp", "gather.cpp", CPP, ["cpu"]),
        "gather_cu": ("cuda", "gather.cu", CUDA, ["NVIDIA_H100"]),
    }
    for name, (language, file, content, hardware) in sources.items():
        solution = fib.Solution.model_validate(
            {
                "name": name,
                "definition": NAME,
                "author": "curator",
                # No binding and no destination_passing_style: flashinfer-bench's defaults,
                # tvm-ffi for C++/CUDA and destination-passing.
                "spec": {
                    "language": language,
                    "target_hardware": hardware,
                    "entry_point": f"{file}::run",
                },
                "sources": [{"path": file, "content": content}],
            }
        )
        path = root / "solutions" / "curator" / "gather" / NAME / f"{name}.json"
        save_json_file(solution, path)
        _add_key(path, ("spec",), "compile_options", ["-O3"])

    trace_set = fib.TraceSet.from_path(str(root))
    workloads = []
    for n in (5, 9):
        uuid = f"w{n}"
        idx = torch.randint(0, 16, (n,), dtype=torch.int32)
        blob = trace_set.add_workload_blob_tensor(NAME, uuid, {"idx": idx})
        workloads.append(
            fib.Workload.model_validate(
                {
                    "uuid": uuid,
                    "axes": {"n": n},
                    "inputs": {
                        "table": {"type": "random"},
                        "idx": {"type": "safetensors", "path": blob, "tensor_key": "idx"},
                    },
                }
            )
        )
    trace_set.add_workload_traces([fib.Trace(definition=NAME, workload=w) for w in workloads])
    evaluation = fib.Evaluation.model_validate(
        {
            "status": "PASSED",
            "environment": {"hardware": "NVIDIA H100", "libs": {"torch": "2.8"}},
            "timestamp": "2026-01-01T00:00:00",
            "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0},
            "performance": {"latency_ms": 0.01, "reference_latency_ms": 0.02,
                            "speedup_factor": 2.0},
        }
    )  # fmt: skip
    # The CUDA solution, far faster there: its H100 figures must not rank it on a CPU.
    on_gpu = evaluation.model_copy(
        update={"performance": fib.Performance(latency_ms=2e-5, reference_latency_ms=0.02,
                                               speedup_factor=1000.0)}
    )  # fmt: skip
    # add_traces writes traces/<op_type>/<definition>.jsonl; a merge, traces/<definition>.jsonl.
    trace_set.add_traces(
        [fib.Trace(definition=NAME, workload=workloads[0], solution="gather_py", evaluation=evaluation)]
        + [fib.Trace(definition=NAME, workload=w, solution="gather_cu", evaluation=on_gpu)
           for w in workloads]
    )  # fmt: skip
    merged = fib.Trace(
        definition=NAME, workload=workloads[1], solution="gather_py", evaluation=evaluation
    )
    save_jsonl_file([merged], root / "traces" / f"{NAME}.jsonl")
    line = root / "traces" / f"{NAME}.jsonl"
    doc = json.loads(line.read_text())
    doc["evaluation"]["performance"]["p90_ms"] = 0.012
    line.write_text(json.dumps(doc) + "\n")


def test_a_flashinfer_bench_dataset_through_validate_bench_report_and_apply(
    tmp_path, capsys, monkeypatch
):
    fib = require_flashinfer_bench()
    require_module("tvm_ffi", "apache-tvm-ffi is not installed (pip install apache-tvm-ffi)")
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "dataset"
    _write_dataset(root, fib)
    assert (root / "traces" / "gather" / f"{NAME}.jsonl").is_file()

    # validate: the newer writer's keys are warnings; everything else is sound. With --load
    # each solution is imported or built: the CUDA one too, wherever nvcc is.
    nvcc = shutil.which("nvcc") is not None
    if nvcc and not torch.cuda.is_available():
        monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0")
        if Path("/usr/local/cuda").is_dir() and not os.environ.get("CUDA_HOME"):
            monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    # Where a GPU is and nvcc is not, the CUDA solution cannot be built, which --load reports
    # as an error: the files alone are validated there.
    load = ["--load"] if nvcc or not torch.cuda.is_available() else []
    assert main(["validate", str(root), *load]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    keys = 5  # the definition's, each solution's, the merged trace's
    # Without nvcc or a GPU: "needs nvcc" and "not loaded", both warnings.
    notes = 0 if nvcc else 1 + (not torch.cuda.is_available())
    assert out.splitlines()[-1] == f"validate: ok: 0 error(s), {keys + notes} warning(s)", out
    assert out.count("unknown key") == keys
    row = next(line for line in out.splitlines() if line.startswith(NAME)).split()
    assert row[1:5] == ["3", "2", "4", "4"]

    # bench on this CPU: the Python and the tvm-ffi C++ solutions run and pass; the CUDA
    # one is said not to run here. Traces go where flashinfer-bench's add_traces puts them.
    assert main(["bench", str(root), "--devices", "cpu", "--quiet", "--repeat", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "bench: all 4 run(s) PASSED", out + err
    assert "not run: 1 cuda solution(s) on a CPU (gather_cu)" in err
    lines = (root / "traces" / "gather" / f"{NAME}.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 2 + 4

    # report reads both writers' traces, at both depths, one table per hardware: the CPU
    # runs supersede nothing of the H100's.
    from fibgen.runtime.selection import hardware
    from fibgen.runtime.selection import best as select

    cpu = hardware.device_name(torch.device("cpu"))
    assert main(["report", str(root), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    tables = summary["definitions"][NAME]["hardware"]
    assert sorted(tables) == sorted(["NVIDIA H100", cpu])
    counts = {
        hw: {s: (v["passed"], v["failed"]) for s, v in t["solutions"].items()}
        for hw, t in tables.items()
    }
    assert counts == {
        "NVIDIA H100": {"gather_cu": (2, 0), "gather_py": (2, 0)},
        cpu: {"gather_cpp": (2, 0), "gather_py": (2, 0)},
    }
    assert summary["superseded"] == 0
    assert main(["report", str(root)]) == 0
    text = capsys.readouterr().out
    assert f"{NAME} on NVIDIA H100" in text and f"{NAME} on {cpu}" in text

    # apply on this CPU (as this process sees it, whatever the machine) ranks the solutions
    # on the CPU's traces alone and skips the CUDA one, saying so once.
    monkeypatch.setattr(hardware, "_gpu_name", lambda: None)
    info = select.build_table(root)["definitions"][NAME]
    assert sorted(info["ranking"]) == ["gather_cpp", "gather_py"] and info["hardware"] == cpu
    table = torch.randn(16, 64)
    idx = torch.tensor([3, 0, 15, 3], dtype=torch.int32)

    @rt.apply(NAME)
    def gather(table, idx, y):
        raise AssertionError("not routed")

    try:
        with pytest.warns(RuntimeWarning) as caught:
            rt.enable_apply(root)
        # fibgen's own: importing FlashInfer may warn too (its CuTe-DSL modules' deprecations).
        (message,) = [str(w.message) for w in caught if str(w.message).startswith("fibgen")]
        assert f"fibgen: {root}: 1 definition(s) routed; not usable: " in message
        assert f"1 solution(s) cannot run on this CPU ({NAME}/gather_cu: cuda needs a " in message
        y = torch.empty(4, 64)
        gather(table, idx, y)
        assert torch.equal(y, table[idx.long()])
        (counts,) = [c for label, c in rt.stats().items() if label.endswith(".gather")]
        assert counts["hit"] == 1 and counts["error"] == 0
    finally:
        rt.disable_apply()

    # And flashinfer-bench still loads everything, fibgen's traces included.
    trace_set = fib.TraceSet.from_path(str(root))
    assert sum(len(v) for v in trace_set.traces.values()) == 2 + 2 + 4
    assert sorted(s.name for v in trace_set.solutions.values() for s in v) == sorted(
        ["gather_py", "gather_cpp", "gather_cu"]
    )


# ---------------------------------------------------------------------------------------
# What flashinfer-bench writes and fibgen cannot use: read with one warning, no traceback.


def _evaluation(fib, status: str, hw: str, errors: float, latency: float = 1.0):
    correctness = fib.Correctness(max_relative_error=errors, max_absolute_error=errors)
    performance = None
    if status == "PASSED":
        performance = fib.Performance(
            latency_ms=latency, reference_latency_ms=2.0, speedup_factor=2.0 / latency
        )
    return fib.Evaluation(
        status=status,
        environment=fib.Environment(hardware=hw),
        timestamp="2026-01-01T00:00:00",
        correctness=correctness,
        performance=performance,
    )


def test_non_finite_errors_absent_solutions_and_other_languages_are_read(tmp_path, monkeypatch):
    fib = require_flashinfer_bench()
    from flashinfer_bench.data import save_json_file

    from fibgen.runtime.selection import hardware

    from _bench_dataset import DEFINITION

    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "_gpu_name", lambda: None)
    root = tmp_path / "dataset"
    name = DEFINITION["name"]
    save_json_file(
        fib.Definition.model_validate(DEFINITION), root / "definitions" / "scale" / f"{name}.json"
    )
    sources = {
        "right": ("python", "def run(x, w):\n    return x * w\n"),
        "overflows": ("python", "def run(x, w):\n    return x * w * float('inf')\n"),
        "fast_tl": ("tilelang", "def run(x, w):\n    return x * w\n"),
    }
    for solution, (language, source) in sources.items():
        model = fib.Solution.model_validate(
            {
                "name": solution,
                "definition": name,
                "author": "curator",
                "spec": {
                    "language": language,
                    "target_hardware": ["cpu"],
                    "entry_point": "main.py::run",
                    "destination_passing_style": False,
                },
                "sources": [{"path": "main.py", "content": source}],
            }
        )
        save_json_file(model, root / "solutions" / "curator" / "scale" / f"{solution}.json")
    trace_set = fib.TraceSet.from_path(str(root))
    cpu = hardware.device_name(torch.device("cpu"))
    workload = fib.Workload.model_validate(
        {"uuid": "n3", "axes": {"n": 3}, "inputs": {"x": {"type": "random"},
                                                    "w": {"type": "random"}}}
    )  # fmt: skip
    inf, nan = float("inf"), float("nan")
    results = [
        ("right", _evaluation(fib, "PASSED", cpu, 1e-6, latency=1.0)),
        # flashinfer-bench's evaluator on an output holding inf; and a PASSED trace whose
        # errors are infinite, which no tolerance admits.
        ("overflows", _evaluation(fib, "INCORRECT_NUMERICAL", cpu, inf)),
        ("overflows", _evaluation(fib, "PASSED", cpu, inf, latency=0.1)),
        ("gone", _evaluation(fib, "INCORRECT_NUMERICAL", cpu, nan)),  # no such solution
        ("fast_tl", _evaluation(fib, "PASSED", cpu, 0.0, latency=0.01)),
    ]
    trace_set.add_traces(
        [fib.Trace(definition=name, workload=workload, solution=s, evaluation=e)
         for s, e in results]
    )  # fmt: skip
    text = (root / "traces" / "scale" / f"{name}.jsonl").read_text()
    assert '"Infinity"' in text and '"NaN"' in text  # as flashinfer-bench writes them

    with pytest.warns(RuntimeWarning) as caught:
        rt.enable_apply(root, {"*": {"atol": 1e-2}})
    try:
        (message,) = [str(w.message) for w in caught]
        assert message.startswith(f"fibgen: {root}: 1 definition(s) routed; not usable: ")
        assert f"1 solution(s) exceed the policy's atol/rtol ({name}/overflows)" in message
        assert f"traces name 1 solution(s) not under {root}/solutions ({name}/gone)" in message
        assert (
            f"1 solution(s) cannot run on this CPU ({name}/fast_tl: fibgen cannot build or "
            "import tilelang solutions)"
        ) in message
        x, w = torch.randn(3, 64), torch.randn(64)
        assert torch.equal(rt.apply(name, args=(x, w), fallback=_unreached), x * w)
        (counts,) = rt.stats().values()
        assert counts["hit"] == 1
    finally:
        rt.disable_apply()


def _unreached(*args):
    raise AssertionError("the solution was not routed to")


# ---------------------------------------------------------------------------------------
# Samplers benched by fibgen, selected by flashinfer-bench (Note [sampler traces])

FIB_SELECTS = """
import json, sys

import torch
import flashinfer_bench as fib

root, name = sys.argv[1], sys.argv[2]
best = fib.TraceSet.from_path(root).get_best_trace(name)
fib.enable_apply(root)  # its default tolerances: max_atol 1e-2, max_rtol 1e-5
probs = torch.softmax(torch.randn(4, 64), -1)
top_k = torch.full((4,), 3, dtype=torch.int32)
out = fib.apply(name, args=(probs, top_k), fallback=lambda *args: torch.full((4,), -1))
allowed = probs.topk(3, -1).indices
print(json.dumps({
    "best": best and best.solution,
    "routed": bool((out >= 0).all()),
    "in_top_k": bool((allowed == out.unsqueeze(-1)).any(-1).all()),
}))
"""


def _flashinfer_bench_selects(root: Path, cache: Path) -> dict:
    import subprocess
    import sys

    from _bench_dataset import SAMPLER

    # A process of its own: flashinfer-bench's apply patches torch.nn.functional.linear.
    env = {**os.environ, "FIB_CACHE_PATH": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", FIB_SELECTS, str(root), SAMPLER],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_sampler_benched_by_fibgen_is_selected_by_flashinfer_bench(tmp_path, monkeypatch):
    require_flashinfer_bench()
    from fibgen.bench.runner import BenchOptions, run_bench

    from _bench_dataset import make_sampling_dataset

    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_sampling_dataset(tmp_path / "ds")

    def bench(*solutions: str) -> None:
        options = BenchOptions(devices=("cpu",), solutions=solutions, repeat=2, timeout=300)
        summary = run_bench(root, options, progress=False)
        assert summary.trace_files

    # Wrong samplers, one drawing outside the valid set, one too far off its distribution:
    # selected by neither get_best_trace nor apply, which falls back.
    bench("argmax", "ignores_top_k")
    selected = _flashinfer_bench_selects(root, tmp_path / "fib-cache")
    assert selected == {"best": None, "routed": False, "in_top_k": False}
    # A right one: selected by both, with flashinfer-bench's default tolerances.
    bench("gumbel")
    selected = _flashinfer_bench_selects(root, tmp_path / "fib-cache")
    assert selected == {"best": "gumbel", "routed": True, "in_top_k": True}
