"""Normalizations with flashinfer.norm's signatures."""

import torch

from fake_flashinfer.calls import CALLS


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight.float()).to(
        weight.dtype
    )


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    """RMS-normalize rows; write into ``out`` when given."""
    CALLS.append("rmsnorm")
    y = _rms(input, weight, eps)
    if out is None:
        return y
    out.copy_(y)
    return out


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """In place: ``residual += input``, then ``input = rmsnorm(residual)``."""
    CALLS.append("fused_add_rmsnorm")
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))
