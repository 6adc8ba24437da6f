"""Inputs for lcs_length: two strings over "ACGT", of `size` and size + size // 3 letters."""

import numpy as np


def generate(seed: int, size: int) -> tuple[str, str]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("ACGT"))
    a = "".join(letters[rng.integers(0, 4, size)].tolist())
    b = "".join(letters[rng.integers(0, 4, size + size // 3)].tolist())
    return a, b
