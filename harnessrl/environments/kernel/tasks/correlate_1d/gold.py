"""Valid-mode 1-D cross-correlation through numpy's correlate."""

import numpy as np


def correlate_valid(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    return np.correlate(x, kernel, mode="valid").astype(np.float64, copy=False)
