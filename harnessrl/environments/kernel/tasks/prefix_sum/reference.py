"""Inclusive prefix sums of a float64 vector, one element at a time."""

import numpy as np


def prefix_sum(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x), dtype=np.float64)
    total = 0.0
    for i in range(len(x)):
        total += x[i]
        out[i] = total
    return out
