"""Inputs for softmax_rows: a (size, 64) float64 array of normal values with standard deviation 5
(large enough that an unstabilised exp would overflow for some rows)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 5.0, (size, 64))
    if size:
        x[0, 0] = 800.0  # exp(800) overflows: only a stable softmax gets this row right
    return (x,)
