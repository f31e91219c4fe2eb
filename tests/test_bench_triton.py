"""The shipped Triton solutions: correct against their definitions' references, on the CPU
through Triton's interpreter, run by the benchmark runner as `fibgen bench` would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fibgen.bench.runner import BenchOptions, run_bench
from fibgen.cli import main
from fibgen.format import Workload, write_workloads

from _shared import require_module

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
    assert main(["build", str(REPO / "definitions"), "-o", str(root)]) == 0
    for name, rows in CASES.items():
        definition = json.loads(next((root / "definitions").glob(f"*/{name}.json")).read_text())
        var = [a for a, s in definition["axes"].items() if s["type"] == "var"][0]
        workloads = [
            Workload.model_validate(
                {
                    "uuid": f"{name}-{n}",
                    "axes": {var: n},
                    "inputs": {i: {"type": "random"} for i in definition["inputs"]},
                }
            )
            for n in rows
        ]
        write_workloads(root, definition["op_type"], name, workloads)
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
