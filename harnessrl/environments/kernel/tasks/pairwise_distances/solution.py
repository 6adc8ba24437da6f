"""Euclidean distances between every row of a and every row of b, coordinate by coordinate."""

import math

import numpy as np


def pairwise_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    left = a.tolist()
    right = b.tolist()
    out = np.empty((len(left), len(right)), dtype=np.float64)
    for i, p in enumerate(left):
        for j, q in enumerate(right):
            s = 0.0
            for u, v in zip(p, q, strict=True):
                s += (u - v) * (u - v)
            out[i, j] = math.sqrt(s)
    return out
