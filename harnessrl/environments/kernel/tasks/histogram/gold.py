"""Counts of each integer value in [0, bins): numpy's bincount."""

import numpy as np


def histogram(values: np.ndarray, bins: int) -> np.ndarray:
    return np.bincount(values.astype(np.int64, copy=False), minlength=bins).astype(np.int64, copy=False)
