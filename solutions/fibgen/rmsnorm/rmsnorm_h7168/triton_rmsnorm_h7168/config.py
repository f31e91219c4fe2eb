"""The epsilon of definition rmsnorm_h7168, which this solution computes."""

EPS = 1e-06
