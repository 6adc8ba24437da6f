"""All-pairs shortest path lengths by the Floyd-Warshall triple loop over Python lists."""

import numpy as np


def shortest_paths(weights: np.ndarray) -> np.ndarray:
    d = weights.tolist()
    n = len(d)
    for k in range(n):
        dk = d[k]
        for i in range(n):
            row = d[i]
            dik = row[k]
            for j in range(n):
                if dik + dk[j] < row[j]:
                    row[j] = dik + dk[j]
    return np.array(d, dtype=np.float64).reshape(n, n)
