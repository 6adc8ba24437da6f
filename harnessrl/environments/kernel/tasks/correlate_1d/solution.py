"""Valid-mode 1-D cross-correlation by a double loop."""

import numpy as np


def correlate_valid(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    n, m = len(x), len(kernel)
    out = np.empty(n - m + 1, dtype=np.float64)
    for i in range(n - m + 1):
        s = 0.0
        for j in range(m):
            s += x[i + j] * kernel[j]
        out[i] = s
    return out
