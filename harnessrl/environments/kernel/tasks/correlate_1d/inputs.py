"""Inputs for correlate_valid: a float64 signal of max(size, 1) normal values and a kernel of
min(31, len(signal)) normal values."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = max(size, 1)
    return rng.standard_normal(n), rng.standard_normal(min(31, n))
