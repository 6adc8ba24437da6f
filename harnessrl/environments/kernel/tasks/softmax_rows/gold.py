"""Row-wise stable softmax, vectorized: subtract each row's max, exponentiate, divide by the row sums."""

import numpy as np


def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e
