"""The epsilon of definition rmsnorm_h512, which this solution computes."""

EPS = 1e-06
