"""Matrix product by the schoolbook triple loop over Python lists."""

import numpy as np


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n, k = a.shape
    m = b.shape[1]
    left = a.tolist()
    right = b.tolist()
    out = np.zeros((n, m), dtype=np.float64)
    for i in range(n):
        row = left[i]
        for j in range(m):
            s = 0.0
            for t in range(k):
                s += row[t] * right[t][j]
            out[i, j] = s
    return out
