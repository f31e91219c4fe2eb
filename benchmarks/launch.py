"""Where the time of a routed call goes, layer by layer, and a check of the fast launch.

    python benchmarks/launch.py [--rows 1,64,1024,4096] [--check]

On a CUDA GPU, for the shipped Triton rmsnorm solution of ``rmsnorm_h4096`` (bf16): the
end-to-end eager latency (``fibgen.bench.eager.time_eager``: back-to-back calls, no flush)
of each layer of a routed call, from the bare kernel launch up to FlashInfer's
``flashinfer.norm.rmsnorm`` patched by ``enable_apply``, beside torch's ``rms_norm`` and
FlashInfer's own kernel (when flashinfer is installed). Ratios are against torch in the same
process. ``--check`` first launches the kernel through fibgen's cache and through Triton on
many shapes and offsets, with ``FIBGEN_CHECK_LAUNCH=1`` comparing every cached launch with
Triton's own specialization, and requires identical outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fibgen.bench.eager import time_eager  # noqa: E402
from fibgen.runtime.launch import fast as launch  # noqa: E402

from _shipped import shipped_solution  # noqa: E402

HIDDEN = 4096
EPS = 1e-5  # rmsnorm_h4096's


def load_entry(name: str):
    """The solution's entry function and its module, loaded as fibgen loads it."""
    from fibgen.runtime.solutions import loading as solutions

    solution = shipped_solution(name)
    fn = solutions._import_solution(solutions.Entry("rmsnorm_h4096", name, solution=solution))
    return solution, fn, sys.modules[fn.__module__]


def check(module) -> str:
    """Fast launches equal Triton's own on many shapes; every cached one checked."""
    kernel_module = sys.modules[module.__name__.rsplit(".", 1)[0] + ".rmsnorm_triton"]
    kernel = kernel_module._rmsnorm_kernel
    fast = launch.accelerated(kernel)
    assert fast is not None, "the solution's kernel was not accelerated"
    fast.check = True
    checked = 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(HIDDEN, device="cuda", generator=gen).bfloat16()
    for rows in (1, 2, 3, 15, 16, 17, 64, 100, 1024, 4097, 65536):
        for offset in (0, 1, 8):  # offsets of 2 and 16 bytes: misaligned and aligned views
            base = torch.randn(rows * HIDDEN + offset, device="cuda", generator=gen).bfloat16()
            x = base[offset:].view(rows, HIDDEN)
            for _ in range(2):  # the second call of a shape is a cached launch
                before = fast.launches
                got = torch.empty_like(x)
                module.run(x, w, got)
                checked += fast.launches - before
            launch.restore(kernel)
            want = torch.empty_like(x)
            module.run(x, w, want)
            launch.accelerate(kernel)
            fast = launch.accelerated(kernel)
            fast.check = True
            torch.cuda.synchronize()
            assert torch.equal(got, want), f"rows={rows} offset={offset}: outputs differ"
    return f"{checked} cached launches checked against Triton's specialization, outputs equal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,64,1024,4096")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/launch.py needs a CUDA GPU")
    rows_list = [int(r) for r in args.rows.split(",")]
    solution, entry, module = load_entry("triton_rmsnorm_h4096")
    if args.check:
        print(check(module))
    kernel_module = sys.modules[module.__name__.rsplit(".", 1)[0] + ".rmsnorm_triton"]
    kernel = kernel_module._rmsnorm_kernel

    import fibgen.runtime as rt

    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001
        flashinfer = None
        print(f"flashinfer not importable ({type(exc).__name__}): its rows are left out")
    from fibgen_kernels.rmsnorm import rmsnorm as dispatcher

    print(f"rmsnorm h{HIDDEN} bf16 on {torch.cuda.get_device_name()}, µs per call, eager loop")
    header = f"{'rows':>6}  {'case':44s} {'µs':>8} {'vs torch':>9}"
    print(header)
    for rows in rows_list:
        x = torch.randn(rows, HIDDEN, device="cuda").bfloat16()
        w = torch.randn(HIDDEN, device="cuda").bfloat16()
        out = torch.empty_like(x)
        cases = []
        cases.append(("torch rms_norm", lambda: F.rms_norm(x, (HIDDEN,), w, EPS)))
        if flashinfer is not None:
            rt.disable_apply() if rt.is_enabled() else None
            fi = flashinfer.norm.rmsnorm
            cases.append(("flashinfer.norm.rmsnorm (its own kernel)", lambda: fi(x, w, EPS)))

        def triton_launch():
            kernel_module.launch(x, None, w, out, eps=EPS)

        cases.append(("solution, Triton's launch", ("triton", triton_launch)))
        cases.append(("solution, fibgen's launch", ("fast", triton_launch)))
        cases.append(("solution entry, out given", lambda: entry(x, w, out)))
        results = []
        for label, fn in cases:
            if isinstance(fn, tuple):
                mode, fn = fn
                (launch.restore if mode == "triton" else launch.accelerate)(kernel)
            results.append((label, time_eager(fn)))
        launch.accelerate(kernel)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rt.enable_apply({"rmsnorm_h4096": solution}, patch=flashinfer is not None)
        from fibgen.runtime.launch import replay

        for _ in range(5):  # the layout is recorded, checked, then replayed
            dispatcher(x, w, EPS)
        replay.wait_native(strict=True)  # timed as a settled process runs: with the C++ table
        results.append(("generated dispatcher, routed", time_eager(lambda: dispatcher(x, w, EPS))))
        if flashinfer is not None:
            patched = flashinfer.norm.rmsnorm
            results.append(
                ("flashinfer.norm.rmsnorm patched, routed", time_eager(lambda: patched(x, w, EPS)))
            )
        hits = rt.stats()["flashinfer.norm.rmsnorm"]["hit"]
        rt.disable_apply()
        assert hits > 0, "the routed rows were not routed"
        torch_us = results[0][1]
        for label, us in results:
            print(f"{rows:>6}  {label:44s} {us:8.2f} {us / torch_us:8.2f}x")
    print(f"Triton {__import__('triton').__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    os.environ.setdefault("FIBGEN_APPLY_STRICT", "0")
    main()
