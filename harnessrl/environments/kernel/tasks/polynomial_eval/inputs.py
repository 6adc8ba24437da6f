"""Inputs for poly_eval: standard normal coefficients (degree random in [0, 23] for small sizes, 20 from 1000
points on, so timing inputs cost the same every repeat) and `size` points uniform in [-1, 1]."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    degree = 20 if size >= 1000 else int(rng.integers(0, 24))
    return rng.standard_normal(degree + 1), rng.uniform(-1.0, 1.0, size)
