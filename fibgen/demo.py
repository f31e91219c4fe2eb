"""A tour of a generated dispatcher: `python -m fibgen.demo` after `fibgen build definitions/`.

It imports the generated `fibgen_kernels.rmsnorm` (the dispatcher of `flashinfer.norm.rmsnorm`),
calls it with apply off (the reference runs: FlashInfer itself is not needed), registers a
Python solution for `rmsnorm_h4096`, calls it again at two hidden sizes (a hit and a
fallback), and prints `stats()`.
"""

from __future__ import annotations

import sys


def my_rmsnorm(hidden_states, weight):
    """A solution: value-returning, called by keyword with the definition's input names."""
    import torch

    x = hidden_states.float()
    inv_rms = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-6)
    return (x * inv_rms * weight.float()).to(hidden_states.dtype)


def main() -> int:
    """Run the demo; exit code 1 with a hint when the generated package is missing."""
    import torch

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
    x = torch.randn(4, 4096, dtype=torch.bfloat16)
    w = torch.randn(4096, dtype=torch.bfloat16)
    reference = rmsnorm(x, w)
    print(f"apply off: rmsnorm{tuple(x.shape)} -> {tuple(reference.shape)} (reference)")
    with rt.enable_apply({"rmsnorm_h4096": my_rmsnorm}, patch=False):
        out = torch.empty_like(x)
        result = rmsnorm(x, w, out=out)
        print(
            f"apply on : rmsnorm_h4096 routed to my_rmsnorm, out= filled in place: "
            f"{result is out}, max |diff| vs reference "
            f"{(result.float() - reference.float()).abs().max().item():.3g}"
        )
        small = rmsnorm(
            torch.randn(2, 2048, dtype=torch.bfloat16), torch.randn(2048, dtype=torch.bfloat16)
        )
        print(f"apply on : rmsnorm_h2048 has no solution -> fallback, {tuple(small.shape)}")
        for api, counts in rt.stats().items():
            print(f"stats()  : {api}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
