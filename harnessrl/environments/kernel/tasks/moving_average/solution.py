"""Means of every window of `window` consecutive values, summed afresh for each window."""

import numpy as np


def moving_average(x: np.ndarray, window: int) -> np.ndarray:
    n = len(x)
    out = np.empty(n - window + 1, dtype=np.float64)
    for i in range(n - window + 1):
        s = 0.0
        for j in range(i, i + window):
            s += x[j]
        out[i] = s / window
    return out
