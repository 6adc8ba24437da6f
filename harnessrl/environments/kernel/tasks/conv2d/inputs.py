"""Inputs for conv2d_valid: a (s, s + 2) float64 normal image, s = max(size, 1), and a
(min(5, s), min(3, s)) normal kernel."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = max(size, 1)
    return rng.standard_normal((s, s + 2)), rng.standard_normal((min(5, s), min(3, s)))
