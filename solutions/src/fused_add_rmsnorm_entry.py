"""Entry point of the fused_add_rmsnorm solution (destination-passing)."""

from .config import EPS
from .rmsnorm_triton import launch


def run(hidden_states, residual, weight, output, inplace=False):
    """Write RMSNorm(hidden_states + residual) * weight into ``output``, with the definition's
    epsilon. ``inplace=True`` (a routed call of FlashInfer's in-place API) also leaves the sum
    in ``residual``, as the API does; ``output`` is then ``hidden_states`` itself."""
    launch(hidden_states, residual, weight, output, EPS, sum_out=residual if inplace else None)
