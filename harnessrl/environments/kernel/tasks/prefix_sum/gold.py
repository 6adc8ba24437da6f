"""Inclusive prefix sums: numpy's sequential cumulative sum (same summation order as the reference)."""

import numpy as np


def prefix_sum(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x, dtype=np.float64)
