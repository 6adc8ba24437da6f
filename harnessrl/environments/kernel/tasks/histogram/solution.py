"""Counts of each integer value in [0, bins), one value at a time."""

import numpy as np


def histogram(values: np.ndarray, bins: int) -> np.ndarray:
    counts = [0] * bins
    for i in range(len(values)):
        counts[int(values[i])] += 1
    return np.array(counts, dtype=np.int64)
