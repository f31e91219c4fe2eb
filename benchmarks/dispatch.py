"""Dispatch overhead: generated dispatchers and hand-written apply() against a direct call
and flashinfer-bench's apply().

Run from the repository root:

    python benchmarks/dispatch.py

flashinfer-bench 0.1.2 is measured in the same process when it is importable. It is not a
dependency of fibgen; install it beside it with

    pip install --no-deps flashinfer-bench==0.1.2 pydantic safetensors apache-tvm-ffi \\
        docstring-parser numpy

Every row is the median over repeats of the time per call of a Python loop, so a row holds
the loop's own cost too; the overhead column subtracts the direct call of the same kernel.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import tempfile
import timeit
import types
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fibgen.runtime as rt  # noqa: E402
from fibgen.codegen.python.dispatch.emit import emit_python_dispatch  # noqa: E402
from fibgen.runtime.checking import result_check  # noqa: E402
from fibgen.compiler import compile_sources  # noqa: E402

API_MODULE = "fibgen_bench_api"
PACKAGE = "fibgen_bench_kernels"
EPS = 1e-6


# The "original APIs" the dispatchers stand for, in a module of their own so that a dotted
# path reaches them.
def noop(x, out=None):
    """The no-op kernel: returns its input."""
    return x


def rmsnorm(input, weight, eps=EPS, out=None):
    """A plain torch RMSNorm."""
    y = input * torch.rsqrt(input.square().mean(-1, keepdim=True) + eps) * weight
    if out is None:
        return y
    out.copy_(y)
    return out


def _api_module() -> None:
    module = types.ModuleType(API_MODULE)
    module.noop, module.rmsnorm = noop, rmsnorm
    sys.modules[API_MODULE] = module


# The dispatchers measured, in the language: the rmsnorm family holds its calls to the
# definition's epsilon as the catalogue's does, and checks every input's dtype and rank.
SOURCE = f"""
family noop {{
  op_type bench
  api {API_MODULE}.noop(x, out=None)
  axes {{
    n : var
    h : const h
  }}
  inputs {{
    x : float32[n, h]
  }}
  outputs {{
    y : float32[n, h] -> out
  }}
  instances {{
    h=4096
  }}
}}

family rmsnorm {{
  op_type bench
  api {API_MODULE}.rmsnorm(input, weight, eps=1e-6, out=None)
  rules {{
    eps == EPS
  }}
  params {{
    EPS = 1e-6
  }}
  axes {{
    n : var
    h : const h
  }}
  inputs {{
    x      : float32[n, h] <- input
    weight : float32[h]
  }}
  outputs {{
    y : float32[n, h] -> out
  }}
  instances {{
    h=4096
  }}
}}
"""


def _generate() -> tuple[types.ModuleType, types.ModuleType]:
    result = compile_sources([("benchmarks/dispatch.fidef", "benchmarks/dispatch.fidef", SOURCE)])
    assert result.module is not None, [str(d) for d in result.diagnostics]
    out = Path(tempfile.mkdtemp(prefix="fibgen-bench-"))
    for f in emit_python_dispatch(result.module, PACKAGE):
        (out / f.path).parent.mkdir(parents=True, exist_ok=True)
        (out / f.path).write_text(f.text, encoding="utf-8")
    sys.path.insert(0, str(out / "python"))
    return (
        importlib.import_module(f"{PACKAGE}.noop"),
        importlib.import_module(f"{PACKAGE}.rmsnorm"),
    )


def per_call_us(fn, repeat: int = 9) -> float:
    """Median microseconds per call of ``fn()``."""
    number = 2000
    while timeit.timeit(fn, number=number) < 0.05:
        number *= 2
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _fibgen_rows(kernel: str, dispatch, direct, args, miss_args, value, dps) -> list[tuple]:
    name = f"{kernel}_h4096"
    out = torch.empty_like(args[0])
    rows = [("direct call", per_call_us(lambda: direct(*args)))]
    rows.append(("fibgen wrapper, apply off", per_call_us(lambda: dispatch(*args))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rt.enable_apply({name: value}, patch=False, packages=()):
            rows.append(("fibgen hit", per_call_us(lambda: dispatch(*args))))
            rows.append(("fibgen miss", per_call_us(lambda: dispatch(*miss_args))))
            rows.append(("fibgen hit with out=", per_call_us(lambda: dispatch(*args, out=out))))
        with rt.enable_apply({name: dps}, patch=False, packages=()):
            rows.append(("fibgen DPS hit", per_call_us(lambda: dispatch(*args))))
            rows.append(("fibgen DPS hit with out=", per_call_us(lambda: dispatch(*args, out=out))))
        rows += _handwritten_rows(name, direct, args)
    return rows


def _handwritten_rows(name: str, direct, args) -> list[tuple]:
    """Hand-written code routed by name (``@apply(name)``, ``apply(name, args)``) to the
    dataset's value-returning solution, its inputs checked against the dataset's definition."""

    @rt.apply(name)
    def decorated(*call_args):
        return direct(*call_args)

    with rt.enable_apply(str(DATASET), patch=False, packages=()):
        rows = [
            ("fibgen apply decorator hit", per_call_us(lambda: decorated(*args))),
            (
                "fibgen apply(name, args) hit",
                per_call_us(lambda: rt.apply(name, args, None, direct)),
            ),
        ]
        stats = rt.stats()
    wrapped = decorated.__wrapped__
    for label in (
        f"{wrapped.__module__}.{wrapped.__qualname__}",
        f"fibgen.runtime.apply({name!r})",
    ):
        counts = stats[label]
        # Every timed call was served by the solution: none went to the fallback.
        assert counts["hit"] > 0 and counts["fallback_guard"] == 0, counts
    return rows


def _fib_dataset(root: Path, kernels: dict[str, tuple[list[str], str, str]]) -> None:
    """A flashinfer-bench dataset: per kernel a definition, a value and a DPS solution, traces."""
    for kernel, (inputs, value_src, dps_src) in kernels.items():
        name = f"{kernel}_h4096"
        tensors = {
            "x": {"shape": ["n", "h"], "dtype": "float32"},
            "weight": {"shape": ["h"], "dtype": "float32"},
        }
        definition = {
            "name": name,
            "op_type": "bench",
            "tags": [],
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 4096}},
            "inputs": {i: tensors[i] for i in inputs},
            "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
            "reference": value_src,
        }
        (root / "definitions" / "bench").mkdir(parents=True, exist_ok=True)
        (root / "definitions" / "bench" / f"{name}.json").write_text(json.dumps(definition))
        traces = []
        for style, src, dps in (("value", value_src, False), ("dps", dps_src, True)):
            solution = {
                "name": f"{name}_{style}",
                "definition": name,
                "author": "bench",
                "spec": {
                    "language": "python",
                    "target_hardware": ["cpu"],
                    "entry_point": "main.py::run",
                    "destination_passing_style": dps,
                },
                "sources": [{"path": "main.py", "content": src}],
            }
            folder = root / "solutions" / "bench" / "bench" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}_{style}.json").write_text(json.dumps(solution))
            traces.append(
                {
                    "definition": name,
                    "workload": {
                        "uuid": f"{name}-{style}",
                        "axes": {"n": 1},
                        "inputs": {i: {"type": "random"} for i in inputs},
                    },
                    "solution": f"{name}_{style}",
                    "evaluation": {
                        "status": "PASSED",
                        "environment": {"hardware": "cpu", "libs": {}},
                        "timestamp": "2026-01-01T00:00:00",
                        "log": "",
                        "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0},
                        "performance": {
                            "latency_ms": 0.01 if style == "value" else 0.02,
                            "reference_latency_ms": 0.02,
                            "speedup_factor": 2.0 if style == "value" else 1.0,
                        },
                    },
                }
            )
        (root / "traces" / "bench" / "bench").mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(t) + "\n" for t in traces)
        (root / "traces" / "bench" / "bench" / f"{name}.jsonl").write_text(lines)


def _flashinfer_bench_rows(kernel: str, direct, args, miss_args) -> list[tuple] | str:
    try:
        import flashinfer_bench as fib
    except ImportError as exc:
        return f"flashinfer-bench not importable ({exc}); see the module docstring"
    name = f"{kernel}_h4096"
    decorated = fib.apply(lambda *a, **k: f"{kernel}_h{a[0].shape[-1]}")(direct)
    out = torch.empty_like(args[0])
    rows = [("flashinfer-bench decorator, apply off", per_call_us(lambda: decorated(*args)))]
    with fib.enable_apply(str(DATASET)):
        rows.append(("flashinfer-bench hit", per_call_us(lambda: decorated(*args))))
        rows.append(("flashinfer-bench miss", per_call_us(lambda: decorated(*miss_args))))
        dps_args = (*args, out)
        rows.append(
            (
                "flashinfer-bench DPS hit",
                per_call_us(lambda: fib.apply(name, args=dps_args, fallback=direct)),
            )
        )
    return rows


DATASET = Path(tempfile.mkdtemp(prefix="fibgen-bench-dataset-"))


def main() -> None:
    """Print one table: every case, for the no-op kernel and a 1x4096 fp32 RMSNorm."""
    _api_module()
    noop_mod, rms_mod = _generate()
    # The result check as a settled process runs it: native once built (Note [result check]).
    result_check.start()
    result_check.wait()
    x, w = torch.randn(1, 4096), torch.randn(4096)
    x2, w2 = torch.randn(1, 2048), torch.randn(2048)

    def rms_value(x, weight):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * weight

    def rms_dps(x, weight, y):
        torch.mul(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS), weight, out=y)

    rms_src = "import torch\n\ndef run(x, weight):\n    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight\n"
    rms_dps_src = "import torch\n\ndef run(x, weight, y):\n    torch.mul(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6), weight, out=y)\n"
    _fib_dataset(
        DATASET,
        {
            "noop": (["x"], "def run(x):\n    return x\n", "def run(x, y):\n    pass\n"),
            "rmsnorm": (["x", "weight"], rms_src, rms_dps_src),
        },
    )
    cases = {
        "no-op": (
            _fibgen_rows(
                "noop",
                noop_mod.noop,
                noop,
                (x,),
                (x2,),
                lambda x: x,
                lambda x, y: None,
            ),
            _flashinfer_bench_rows("noop", noop, (x,), (x2,)),
        ),
        "rmsnorm 1x4096 fp32": (
            _fibgen_rows("rmsnorm", rms_mod.rmsnorm, rmsnorm, (x, w), (x2, w2), rms_value, rms_dps),
            _flashinfer_bench_rows("rmsnorm", rmsnorm, (x, w), (x2, w2)),
        ),
    }
    print(f"{'kernel':<20} {'case':<40} {'us/call':>9} {'overhead':>9}")
    for kernel, (ours, theirs) in cases.items():
        base = ours[0][1]
        rows = ours + (theirs if isinstance(theirs, list) else [])
        for case, us in rows:
            print(f"{kernel:<20} {case:<40} {us:>9.3f} {us - base:>+9.3f}")
        if isinstance(theirs, str):
            print(f"{kernel:<20} {theirs}")
    native = result_check.current() is not result_check.same_python
    print(
        f"result check of one output ({'native' if native else 'Python'}: a tensor, its dtype, "
        f"its shape against the input's, its device): {_result_check_us():.3f} us "
        "(target <= 0.3 us)"
    )
    print(
        f"import of fibgen.runtime + fibgen_kernels.rmsnorm on top of torch: "
        f"{_import_cost_ms():.1f} ms (median of 7 fresh interpreters, bytecode cached; target <= 50 ms)"
    )


def _result_check_us() -> float:
    """The check of a value-returning solution's output, as the hit path calls it."""
    x = torch.randn(1, 4096)
    o = torch.randn(1, 4096)
    names = {"_o": o, "_same": result_check.current(), "_F32": torch.float32, "_s": x.shape}
    names["x"] = x
    number = 200000
    timed = min(timeit.repeat("_same(_o, _F32, _s, x)", globals=names, number=number, repeat=9))
    empty = min(timeit.repeat("pass", number=number, repeat=9))
    return (timed - empty) / number * 1e6


_IMPORT_PROBE = """
import time, torch
start = time.perf_counter()
import fibgen.runtime, fibgen_kernels.rmsnorm
print(time.perf_counter() - start)
"""


def _import_cost_ms() -> float:
    """Time to import the runtime and a generated module in a fresh process, torch loaded."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}:{root / 'generated' / 'python'}"}
    # As an installed package is imported: from cached bytecode, which the first run writes.
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def once() -> float:
        probe = [sys.executable, "-c", _IMPORT_PROBE]
        done = subprocess.run(probe, env=env, check=True, capture_output=True, text=True)
        return float(done.stdout)

    once()
    return statistics.median(once() for _ in range(7)) * 1e3


if __name__ == "__main__":
    main()
