"""Inputs for lis_length: a list of `size` Python ints uniform in [0, 2 * size + 1) (repeats occur)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[list[int]]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2 * size + 1, size).tolist(),)
