"""The epsilon of definition rmsnorm_h5120, which this solution computes."""

EPS = 1e-06
