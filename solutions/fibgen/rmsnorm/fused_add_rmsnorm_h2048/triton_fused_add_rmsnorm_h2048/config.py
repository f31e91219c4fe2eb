"""The epsilon of definition fused_add_rmsnorm_h2048, which this solution computes."""

EPS = 1e-06
