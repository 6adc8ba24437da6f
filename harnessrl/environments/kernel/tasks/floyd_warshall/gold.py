"""All-pairs shortest path lengths: Floyd-Warshall with each k-step as one broadcast minimum (n numpy ops)."""

import numpy as np


def shortest_paths(weights: np.ndarray) -> np.ndarray:
    d = np.array(weights, dtype=np.float64, copy=True)
    for k in range(len(d)):
        np.minimum(d, d[:, k, None] + d[None, k, :], out=d)
    return d
