"""Inputs for histogram: `size` int64 values uniform in [0, bins), bins between 1 and 1000."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(seed)
    bins = int(rng.integers(1, min(1000, size // 10 + 2) + 1))
    return rng.integers(0, bins, size, dtype=np.int64), bins
