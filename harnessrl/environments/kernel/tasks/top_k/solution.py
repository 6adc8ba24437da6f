"""Indices of the k largest values by k passes of selection (ties: the lower index first)."""

import numpy as np


def top_k(x: np.ndarray, k: int) -> list[int]:
    values = x.tolist()
    taken = [False] * len(values)
    out: list[int] = []
    for _ in range(k):
        best = -1
        for i, v in enumerate(values):
            if not taken[i] and (best < 0 or v > values[best]):
                best = i
        taken[best] = True
        out.append(best)
    return out
