"""Inputs for prefix_sum: one float64 vector of `size` standard normal values."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(size),)
