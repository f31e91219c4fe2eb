"""GPU acceptance of the CUDA path: a cuda scaffold of rmsnorm_h4096 built, routed and checked.

Usage: ``python benchmarks/cuda_scaffold_gpu.py --generated GEN --solutions SOLUTIONS`` where
GEN is the output of ``fibgen build definitions/`` and SOLUTIONS holds the scaffold written by
``fibgen scaffold-solution rmsnorm_h4096 --language cuda``. The script builds the scaffold
through ``enable_apply``, calls the generated dispatcher on CUDA tensors at several batch
sizes and compares with the reference, checks that a wrong shape fails with the launcher's
message, and builds and calls the generated target's own module (``cuda/rmsnorm_h4096``).
It prints one line per check and exits non-zero if any fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

NAME = "rmsnorm_h4096"
FAILURES: list[str] = []


def report(ok: bool, what: str) -> None:
    """Print one check's outcome and remember failures."""
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)
    if not ok:
        FAILURES.append(what)


def load_file(name: str, path: Path):
    """Import a generated module from its file."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    """Run every check; the exit status says whether all passed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--generated", type=Path, required=True)
    parser.add_argument("--solutions", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(args.generated / "python"))

    import fibgen.runtime as rt
    from fibgen.runtime.checking.compare import compare
    from fibgen.runtime.inputs.make import InputSpec, generate_inputs_with_axes
    from fibgen_kernels import rmsnorm

    definition = json.loads((args.generated / "definitions/rmsnorm" / f"{NAME}.json").read_text())
    reference = load_file("reference", args.generated / "reference/rmsnorm" / f"{NAME}.py").run
    spec = InputSpec.from_definition_json(definition)

    def inputs(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        made, _ = generate_inputs_with_axes(spec, {"batch_size": batch}, device="cuda", seed=seed)
        return made["hidden_states"], made["weight"]

    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    (solution,) = sorted(args.solutions.rglob("*.json"))
    print(f"solution: {solution.relative_to(args.solutions)}")
    with rt.enable_apply({NAME: str(solution)}, patch=False):
        for batch in (1, 7, 4096):
            x, w = inputs(batch, seed=batch)
            start = time.perf_counter()
            out = rmsnorm.rmsnorm(x, w)
            torch.cuda.synchronize()
            took = time.perf_counter() - start
            result = compare(out, reference(x, w))
            built = f"; first call (build + load) {took:.1f} s" if batch == 1 else ""
            report(result.ok, f"batch {batch}: matches the reference ({result}){built}")
        x, w = inputs(7, seed=70)
        buffer = torch.empty_like(x)
        got = rmsnorm.rmsnorm(x, w, out=buffer)
        report(got is buffer and compare(buffer, reference(x, w)).ok, "out= buffer filled")
        try:
            rmsnorm.rmsnorm(x, w[:4095])
            report(False, "wrong shape refused")
        except rt.SolutionError as exc:
            print(f"      message: {exc}")
            expected = "weight has size 4095 along axis hidden_size (dim 0), expected 4096"
            report(expected in str(exc), "wrong shape refused with the launcher's message")
        counts = rt.stats()["flashinfer.norm.rmsnorm"]
        print(f"      stats: {counts}")
        report(counts["hit"] == 4 and counts["error"] == 1, "stats count 4 hits and 1 error")

    module = load_file("generated_cuda", args.generated / "cuda" / NAME / "__init__.py")
    x, w = inputs(33, seed=33)
    report(compare(module.run(x, w), reference(x, w)).ok, f"generated cuda/{NAME}: run()")
    buffer = torch.empty_like(x)
    module.run_dps(x, w, buffer)
    report(compare(buffer, reference(x, w)).ok, f"generated cuda/{NAME}: run_dps()")
    try:
        module.run(x.float(), w)
        report(False, f"generated cuda/{NAME} refuses float32 input")
    except TypeError as exc:
        print(f"      message: {exc}")
        ok = str(exc).startswith(f"{NAME}: hidden_states has dtype float32, expected bfloat16")
        report(ok, f"generated cuda/{NAME} refuses float32 input")
    print("all checks passed" if not FAILURES else f"{len(FAILURES)} checks failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
