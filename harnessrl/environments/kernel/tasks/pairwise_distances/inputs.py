"""Inputs for pairwise_distances: a (size, 8) and a (size + 3, 8) float64 array, uniform in [0, 1)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((size, 8)), rng.random((size + 3, 8))
