"""Inputs for knapsack: `size` items with Python-int weights in [1, 100] and values in [1, 1000], and a
capacity of 25 * size (half the expected total weight)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[list[int], list[int], int]:
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 101, size).tolist()
    values = rng.integers(1, 1001, size).tolist()
    return weights, values, 25 * size
