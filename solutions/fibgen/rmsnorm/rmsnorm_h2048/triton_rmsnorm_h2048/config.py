"""The epsilon of definition rmsnorm_h2048, which this solution computes."""

EPS = 1e-06
