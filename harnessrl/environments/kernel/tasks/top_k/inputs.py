"""Inputs for top_k: `size` (>= 1) float64 values on a 0.1 grid in [0, 100) (so ties are common) and
k = min(size, 32)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(seed)
    size = max(size, 1)
    return rng.integers(0, 1000, size) / 10.0, min(size, 32)
