"""The epsilon of definition rmsnorm_h128, which this solution computes."""

EPS = 1e-06
