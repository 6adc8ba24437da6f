"""Inputs for moving_average: `size` (>= 1) standard normal values and a window: random in
[1, min(32, size)] for small sizes, 16 from 1000 values on (timing inputs then cost the same every repeat)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(seed)
    size = max(size, 1)
    window = 16 if size >= 1000 else int(rng.integers(1, min(32, size) + 1))
    return rng.standard_normal(size), window
