"""The shipped Triton solutions: correct against their definitions' references, on the CPU
through Triton's interpreter, run by the benchmark runner as `fibgen bench` would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _shared import require_module

from fibgen.bench.runner import BenchOptions, run_bench
from fibgen.cli import main
from fibgen.paths import builtin_definition_file

# Slow as a whole: bench workers running Triton solutions under the interpreter.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

require_module("triton", "triton is not installed")
require_module("numpy", "Triton's interpreter needs numpy")

# definition -> row counts (small: the interpreter runs each program in Python)
CASES = {
    "rmsnorm_h128": (1, 37),
    "rmsnorm_h4096": (3,),
    "fused_add_rmsnorm_h2048": (5,),
    "silu_and_mul_h12288_bf16": (2,),
    "silu_and_mul_h12288_fp16": (2,),
}


def test_solution_files_hold_the_current_sources(capsys):
    # Each shipped solution is a folder whose sources link to solutions/src/; its JSON is
    # packed from them with `fibgen pack solutions`.
    assert main(["pack", "--check", str(REPO / "solutions")]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.endswith("21 of 21 solution(s) already up to date\n")


def test_triton_solutions_pass_under_the_interpreter(tmp_path, monkeypatch):
    # Nothing set by hand: a CPU worker runs Triton under its interpreter by itself.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "ds"
    for name, rows in CASES.items():
        # The dataset as a user makes one: the catalogue's definition and random workloads.
        definition = json.loads(builtin_definition_file(name).read_text())
        (var,) = [a for a, s in definition["axes"].items() if s["type"] == "var"]
        sizes = ",".join(map(str, rows))
        assert main(["workloads", name, "--axes", f"{var}={sizes}", "-o", str(root)]) == 0
        source = next((REPO / "solutions").glob(f"fibgen/*/{name}/*/*.json"))
        target = root / "solutions" / source.relative_to(REPO / "solutions")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    summary = run_bench(
        root, BenchOptions(devices=("cpu",), warmup=1, repeat=1, timeout=300), progress=False
    )
    assert summary.problems == []
    failed = [
        (t["solution"], t["workload"]["uuid"], t["evaluation"]["log"][-300:])
        for path in summary.trace_files
        for t in map(json.loads, path.read_text().splitlines())
        if t["evaluation"]["status"] != "PASSED"
    ]
    assert not failed
    assert summary.statuses == {"PASSED": sum(len(r) for r in CASES.values())}


_ROUTED = r"""
import json, sys, warnings
from pathlib import Path
import torch
from fibgen.format import Solution
import fibgen.runtime as rt
from fibgen_kernels.fused_add_rmsnorm import fused_add_rmsnorm

repo = Path(sys.argv[1])
path = next(repo.glob("solutions/fibgen/rmsnorm/fused_add_rmsnorm_h2048/*/*.json"))
solution = Solution.model_validate(json.loads(path.read_text()))
torch.manual_seed(0)
results = {}
for strided in (False, True):
    x = torch.randn(5, 2048).bfloat16()
    r = torch.randn(2048, 5).bfloat16().T if strided else torch.randn(5, 2048).bfloat16()
    w = torch.randn(2048).bfloat16()
    total = x.float() + r.float()
    want_x = (total * torch.rsqrt(total.square().mean(-1, keepdim=True) + 1e-6) * w.float())
    want_r = (x + r).clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rt.enable_apply({"fused_add_rmsnorm_h2048": solution}, patch=False):
            fused_add_rmsnorm(x, r, w, 1e-6)
            stats = rt.stats()["flashinfer.norm.fused_add_rmsnorm"]
    # Within one bf16 rounding: the interpreter rounds its casts its own way.
    ulp = want_r.float().abs() * 2**-7 + 1e-30
    results[str(strided)] = [
        (x.float() - want_x).abs().max().item(),
        bool(((r.float() - want_r.float()).abs() <= ulp).all()),
        stats["hit"],
    ]
print(json.dumps(results))
"""


def test_routed_fused_add_rmsnorm_leaves_the_sum_in_residual_as_flashinfer_does(tmp_path):
    # The shipped solution takes `inplace` (Note [in-place solutions]): routed, it writes
    # the normalized rows into `input` and the sum into `residual` in one kernel, also when
    # `residual` is a strided view.
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1", FIBGEN_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", _ROUTED, str(REPO)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.splitlines()[-1])
    for strided, (err, residual_ok, hits) in results.items():
        assert err < 0.07 and residual_ok and hits == 1, (strided, err, residual_ok, hits)


def _shipped_source_module(name, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(REPO / "solutions" / "src"))
    import importlib
    import sys

    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_silu_and_mul_walks_long_batches_row_by_row_with_the_same_result(monkeypatch):
    # From ROW_WALK_FROM rows one program walks each row block by block (a row here is two
    # blocks, the second one partial); below, a program per block. Both compute the same.
    import torch

    silu = _shipped_source_module("silu_and_mul_triton", monkeypatch)
    monkeypatch.setattr(silu, "ROW_WALK_FROM", 3)
    torch.manual_seed(0)
    for rows, kernel in ((2, silu._silu_and_mul_kernel), (3, silu._silu_and_mul_rows_kernel)):
        x = torch.randn(rows, 2 * 3000)
        out = torch.full((rows, 3000), float("nan"))
        silu.launch(x, out)
        assert silu._PLANS[rows, 3000, x.device][0] is kernel
        want = torch.nn.functional.silu(x[:, :3000]) * x[:, 3000:]
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_fused_add_rmsnorm_on_a_persistent_grid_covers_every_row(monkeypatch):
    # Short batches of the fused add run on a grid of a few programs per SM that walk the
    # rows (one SM under the interpreter: 4 programs for 11 rows); longer ones, one program
    # per row. Every row is summed and normalized either way.
    import torch

    norm = _shipped_source_module("rmsnorm_triton", monkeypatch)
    torch.manual_seed(0)
    for rows, most in ((11, norm.PERSISTENT[2]), (11, 0)):
        monkeypatch.setattr(norm, "PERSISTENT", (4, 8, most))
        norm._PLANS.clear()
        x, r, w = torch.randn(rows, 1024), torch.randn(rows, 1024), torch.randn(1024)
        total = x + r
        out = torch.full_like(x, float("nan"))
        norm.launch(x, r, w, out, 1e-6, sum_out=r)
        (grid,), _, _, _, walk, _ = next(iter(norm._PLANS.values()))
        assert (grid, walk) == ((4, True) if most else (rows, False))
        torch.testing.assert_close(r, total)
        want = torch.nn.functional.rms_norm(total, (1024,), w, 1e-6)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_without_triton_a_triton_solution_is_a_compile_error_saying_how_to_install_it(tmp_path):
    # Said in one line, not as the traceback of an import (Note [Triton without a GPU]).
    import os
    import subprocess
    import sys

    from _shared import without_modules

    root = tmp_path / "ds"
    assert main(["workloads", "rmsnorm_h128", "--axes", "batch_size=2", "-o", str(root)]) == 0
    source = next((REPO / "solutions").glob("fibgen/*/rmsnorm_h128/*/*.json"))
    target = root / "solutions" / source.relative_to(REPO / "solutions")
    target.parent.mkdir(parents=True)
    shutil.copy(source, target)
    env = without_modules(tmp_path / "no_triton", "triton")
    env.pop("TRITON_INTERPRET", None)
    env["FIBGEN_CACHE_DIR"] = str(tmp_path / "cache")
    code = "import sys; from fibgen.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "bench", str(root), "--devices", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.getcwd(),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    (trace,) = [json.loads(line) for line in next(root.glob("traces/*/*.jsonl")).open()]
    assert trace["evaluation"]["status"] == "COMPILE_ERROR"
    assert trace["evaluation"]["log"] == (
        "solution 'triton_rmsnorm_h128' for definition 'rmsnorm_h128' is a Triton solution, "
        "and Triton is not installed here: pip install 'fibgen[triton]'"
    )
