"""A tour of a generated dispatcher: `python -m fibgen.demo` after `fibgen build definitions/`.

It imports the generated `fibgen_kernels.rmsnorm` (the dispatcher of `flashinfer.norm.rmsnorm`),
calls it with apply off, registers a Python solution for `rmsnorm_h4096`, calls it again at two
hidden sizes (a hit and a fallback), and prints `stats()`.

A call that is not routed runs what the API is: FlashInfer's own kernel where FlashInfer can
run (installed, with a GPU), and the definition's reference where FlashInfer is not installed.
Where flashinfer-python is installed but there is no GPU, its kernels cannot run: the demo
then leaves it out of this process and says so, so that those calls run the reference.
"""

from __future__ import annotations

import importlib.util
import sys


def my_rmsnorm(hidden_states, weight):
    """A solution: value-returning, called by keyword with the definition's input names."""
    import torch

    x = hidden_states.float()
    # rmsnorm_h4096 is Llama-3.1-8B's: its epsilon is 1e-5, and calls with another go elsewhere.
    inv_rms = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-5)
    return (x * inv_rms * weight.float()).to(hidden_states.dtype)


def _flashinfer() -> str:
    """``"runs"``, ``"absent"``, or ``"no-gpu"`` (installed, no GPU for its kernels)."""
    import torch

    if "flashinfer" not in sys.modules and importlib.util.find_spec("flashinfer") is None:
        return "absent"
    return "runs" if torch.cuda.is_available() else "no-gpu"


def main() -> int:
    """Run the demo; exit code 1 with a hint when the generated package is missing."""
    import torch

    flashinfer = _flashinfer()
    if flashinfer == "no-gpu" and "flashinfer" not in sys.modules:
        # The dispatcher finds no FlashInfer to fall back to and runs the reference instead.
        sys.modules["flashinfer"] = None  # type: ignore[assignment]
        print(
            "note: flashinfer-python is installed, but its kernels need a GPU: this demo runs "
            "without it, so calls that are not routed run the definition's reference"
        )
        flashinfer = "absent"
    import fibgen.runtime as rt

    try:
        from fibgen_kernels.rmsnorm import rmsnorm
    except ImportError:
        print(
            "error: fibgen_kernels is not importable; run `fibgen build definitions/` and "
            "`pip install -e .` first",
            file=sys.stderr,
        )
        return 1
    device = "cuda" if flashinfer == "runs" else "cpu"
    original = "FlashInfer's kernel" if flashinfer == "runs" else "the reference"
    x = torch.randn(4, 4096, dtype=torch.bfloat16, device=device)
    w = torch.randn(4096, dtype=torch.bfloat16, device=device)
    before = rmsnorm(x, w, eps=1e-5)
    print(f"apply off: rmsnorm{tuple(x.shape)} -> {tuple(before.shape)} ({original})")
    with rt.enable_apply({"rmsnorm_h4096": my_rmsnorm}, patch=False):
        out = torch.empty_like(x)
        result = rmsnorm(x, w, eps=1e-5, out=out)
        print(
            f"apply on : rmsnorm_h4096 routed to my_rmsnorm, out= filled in place: "
            f"{result is out}, max |diff| vs {original} "
            f"{(result.float() - before.float()).abs().max().item():.3g}"
        )
        small = rmsnorm(
            torch.randn(2, 2048, dtype=torch.bfloat16, device=device),
            torch.randn(2048, dtype=torch.bfloat16, device=device),
        )
        print(
            f"apply on : rmsnorm_h2048 has no solution -> fallback to {original}, "
            f"{tuple(small.shape)}"
        )
        for api, counts in rt.stats().items():
            print(f"stats()  : {api}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
