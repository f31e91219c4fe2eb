"""The epsilon of definition rmsnorm_h5376, which this solution computes."""

EPS = 1e-06
