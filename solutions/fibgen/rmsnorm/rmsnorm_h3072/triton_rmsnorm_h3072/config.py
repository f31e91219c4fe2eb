"""The epsilon of definition rmsnorm_h3072, which this solution computes."""

EPS = 1e-06
