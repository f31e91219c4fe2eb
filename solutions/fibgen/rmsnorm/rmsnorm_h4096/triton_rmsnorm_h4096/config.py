"""The epsilon of definition rmsnorm_h4096, which this solution computes."""

EPS = 1e-05
