"""Run-length encoding: run starts are where the vector changes (np.diff), lengths their differences."""

import numpy as np


def run_length_encode(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    bounds = np.concatenate(([0], np.flatnonzero(x[1:] != x[:-1]) + 1, [n]))
    return x[bounds[:-1]].astype(np.int64), np.diff(bounds).astype(np.int64)
