"""The epsilon of definition fused_add_rmsnorm_h4096, which this solution computes."""

EPS = 1e-05
