"""The epsilon of definition rmsnorm_h1536, which this solution computes."""

EPS = 1e-06
