"""Inputs for matmul: a (size, size + 1) and a (size + 1, max(size - 1, 1)) float64 normal matrix."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, size + 1)), rng.standard_normal((size + 1, max(size - 1, 1)))
