"""cpp/cuda solutions with the tvm-ffi binding (flashinfer-bench's default) build and run.

A C++ solution runs on the CPU here; a CUDA one is compiled with nvcc wherever nvcc is, and
run where there is a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

import fibgen.runtime as rt
from fibgen.format import Solution
from fibgen.runtime.solutions import builders
from fibgen.runtime.solutions import loading as solutions

from _bench_dataset import DEFINITION
from _shared import require_module

require_module("tvm_ffi", "apache-tvm-ffi is not installed (pip install apache-tvm-ffi)")

# Slow as a whole: compiles tvm-ffi C++ solutions.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("c++") is None and shutil.which("g++") is None,
        reason="building cpp solutions needs a C++ compiler (c++ or g++) on PATH",
    ),
]

# y = x * w over float32[n, 64] and float32[64], destination-passing: flashinfer-bench's form.
SCALE_CPP = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

void Scale(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  if (x.ndim() != 2 || w.ndim() != 1 || x.size(1) != w.size(0)) {
    TVM_FFI_THROW(ValueError) << "x must be [n, h] and w [h]";
  }
  const float* xp = static_cast<const float*>(x.data_ptr());
  const float* wp = static_cast<const float*>(w.data_ptr());
  float* yp = static_cast<float*>(y.data_ptr());
  for (int64_t i = 0; i < x.size(0); ++i)
    for (int64_t j = 0; j < x.size(1); ++j) yp[i * x.size(1) + j] = xp[i * x.size(1) + j] * wp[j];
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Scale);
"""

SCALE_CU = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

__global__ void ScaleKernel(const float* x, const float* w, float* y, int64_t n, int64_t h) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n * h) y[i] = x[i] * w[i % h];
}

void Scale(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
  int64_t n = x.size(0), h = x.size(1);
  DLDevice dev = x.device();
  cudaStream_t stream =
      static_cast<cudaStream_t>(TVMFFIEnvGetStream(dev.device_type, dev.device_id));
  int64_t total = n * h;
  ScaleKernel<<<(total + 255) / 256, 256, 0, stream>>>(
      static_cast<const float*>(x.data_ptr()), static_cast<const float*>(w.data_ptr()),
      static_cast<float*>(y.data_ptr()), n, h);
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Scale);
"""


def tvm_solution(name: str, language: str, file: str, source: str, **spec) -> Solution:
    """A solution as flashinfer-bench writes one: no binding given (tvm-ffi), DPS."""
    return Solution.model_validate(
        {
            "name": name,
            "definition": DEFINITION["name"],
            "author": "tester",
            "spec": {
                "language": language,
                "target_hardware": ["cpu"] if language == "cpp" else ["cuda"],
                "entry_point": f"{file}::run",
                **spec,
            },
            "sources": [{"path": file, "content": source}],
        }
    )


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tvm-cache"))


def test_a_cpp_tvm_ffi_solution_builds_and_runs_on_the_cpu():
    solution = tvm_solution("scale_cpp", "cpp", "scale.cpp", SCALE_CPP)
    assert solution.spec.binding is None  # flashinfer-bench's default: tvm-ffi
    entry = solutions.Entry(solution.definition, "scale_cpp", solution=solution)
    loaded = solutions.load(entry, ("x", "w"), ("y",))
    assert loaded.dps
    x, w, y = torch.randn(3, 64), torch.randn(64), torch.empty(3, 64)
    loaded.fn(x=x, w=w, y=y)
    assert torch.equal(y, x * w)
    with pytest.raises(Exception, match="x must be"):
        loaded.fn(x=x, w=torch.randn(8), y=y)
    # Built once: another load of the same sources is the cached module.
    _, built = builders.build_solution(solution)
    assert built is False


def test_hand_written_apply_routes_to_it(tmp_path):
    path = tmp_path / "scale_cpp.json"
    path.write_text(tvm_solution("scale_cpp", "cpp", "scale.cpp", SCALE_CPP).model_dump_json())

    @rt.apply(DEFINITION["name"])
    def scale(x, w, y):
        y.copy_(x)

    x, w = torch.randn(2, 64), torch.randn(64)
    with rt.enable_apply({DEFINITION["name"]: str(path)}, patch=False):
        y = torch.empty(2, 64)
        scale(x, w, y)
    assert torch.equal(y, x * w)


def test_a_compile_error_shows_the_compilers_message_only():
    broken = tvm_solution("broken", "cpp", "k.cpp", "void run() { return undeclared; }\n")
    with pytest.raises(builders.BuildError) as info:
        builders.build_solution(broken)
    message = str(info.value)
    assert message.startswith("solution 'broken' failed to compile:\n")
    assert "k.cpp:1:" in message and "undeclared" in message
    assert "ninja" not in message and "FAILED" not in message


def test_a_missing_export_says_how_to_export(tmp_path):
    source = SCALE_CPP.replace("TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Scale);", "")
    with pytest.raises(builders.BuildError, match=r"TVM_FFI_DLL_EXPORT_TYPED_FUNC\(run, \.\.\.\)"):
        builders.build_solution(tvm_solution("noexport", "cpp", "scale.cpp", source))


def test_without_apache_tvm_ffi_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)
    other = tvm_solution("other", "cpp", "scale.cpp", SCALE_CPP + "// another build\n")
    with pytest.raises(builders.BuildError, match="pip install apache-tvm-ffi"):
        builders.build_solution(other)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiling CUDA needs nvcc")
def test_a_cuda_tvm_ffi_solution_compiles_with_nvcc_and_runs_on_a_gpu(monkeypatch):
    if not torch.cuda.is_available():
        # No GPU to read the architecture from: compile for an H100's, as one would here.
        monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0")
    toolkit = Path(shutil.which("nvcc")).resolve().parents[1]
    if not (toolkit / "include" / "cuda_runtime.h").is_file() and Path("/usr/local/cuda").is_dir():
        # nvcc is a wrapper script here: name the toolkit it runs.
        monkeypatch.setenv("CUDA_HOME", os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    solution = tvm_solution("scale_cu", "cuda", "scale.cu", SCALE_CU)
    fn, _ = builders.build_solution(solution)
    assert callable(fn)
    if not torch.cuda.is_available():
        return  # running it needs a GPU; the build above is what a CPU can check
    x = torch.randn(5, 64, device="cuda")
    w = torch.randn(64, device="cuda")
    y = torch.empty(5, 64, device="cuda")
    entry = solutions.Entry(solution.definition, "scale_cu", solution=solution)
    solutions.load(entry, ("x", "w"), ("y",)).fn(x=x, w=w, y=y)
    torch.cuda.synchronize()
    assert torch.allclose(y, x * w)


def test_bench_runs_a_tvm_ffi_solution_as_flashinfer_bench_wrote_it(tmp_path):
    from fibgen.bench.runner import BenchOptions, run_bench
    from fibgen.format import write_solution

    from _bench_dataset import make_dataset

    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    write_solution(root, tvm_solution("scale_cpp", "cpp", "scale.cpp", SCALE_CPP), "scale")
    summary = run_bench(root, BenchOptions(devices=("cpu",), repeat=3, timeout=600), progress=False)
    assert summary.statuses == {"PASSED": 1}, [
        json.loads(line)["evaluation"]["log"]
        for p in summary.trace_files
        for line in Path(p).read_text().splitlines()
    ]
