"""Inputs for run_length_encode: `size` int64 values in [0, 5) made of runs of 1 to 5 equal values."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.repeat(rng.integers(0, 5, size + 1), rng.integers(1, 6, size + 1))[:size]
    return (x.astype(np.int64),)
