"""0/1 knapsack: one int64 row over the capacities, each item one vectorized maximum against the row shifted
by its weight (the right-hand side reads the previous row: numpy evaluates it before assigning)."""

import numpy as np


def knapsack(weights: list[int], values: list[int], capacity: int) -> int:
    best = np.zeros(capacity + 1, dtype=np.int64)
    for w, v in zip(weights, values, strict=True):
        if w <= capacity:
            best[w:] = np.maximum(best[w:], best[: capacity + 1 - w] + v)
    return int(best[capacity])
