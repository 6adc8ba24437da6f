"""Row-wise numerically stable softmax of a 2-D array, element by element with math.exp."""

import math

import numpy as np


def softmax_rows(x: np.ndarray) -> np.ndarray:
    rows, cols = x.shape
    out = np.empty((rows, cols), dtype=np.float64)
    for i in range(rows):
        m = max(x[i, j] for j in range(cols))
        exps = [math.exp(x[i, j] - m) for j in range(cols)]
        s = sum(exps)
        for j in range(cols):
            out[i, j] = exps[j] / s
    return out
