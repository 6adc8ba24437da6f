"""Inputs for shortest_paths: a (size, size) float64 weight matrix: 0 on the diagonal, an edge with an
integer weight in [1, 100) with probability 0.3, else inf (no edge). Integer weights keep sums exact."""

import numpy as np


def generate(seed: int, size: int) -> tuple[np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.integers(1, 100, (size, size)).astype(np.float64)
    w[rng.random((size, size)) >= 0.3] = np.inf
    np.fill_diagonal(w, 0.0)
    return (w,)
