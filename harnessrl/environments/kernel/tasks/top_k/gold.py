"""Indices of the k largest values: a stable sort of the negated values keeps equal values in index order.
For k much smaller than n, argpartition first narrows the candidates to those >= the k-th largest value."""

import numpy as np


def top_k(x: np.ndarray, k: int) -> list[int]:
    n = len(x)
    if k <= 0:
        return []
    if k < n // 8:
        kth = np.partition(x, n - k)[n - k]  # the k-th largest value
        idx = np.flatnonzero(x >= kth)  # every index that can be in the answer, in index order
        order = np.argsort(-x[idx], kind="stable")[:k]
        return idx[order].tolist()
    return np.argsort(-x, kind="stable")[:k].tolist()
