"""Inputs for count_primes: a window [lo, lo + size). Small sizes: lo uniform in [0, 10**7), or in [0, 100)
for a third of the seeds (the cases 0, 1, 2). From 1000 on (timing): lo uniform in [5 * 10**6, 10**7), so
every repeat costs about the same."""

import numpy as np


def generate(seed: int, size: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    if size >= 1000:
        lo = int(rng.integers(5 * 10**6, 10**7))
    elif rng.random() < 1 / 3:
        lo = int(rng.integers(0, 100))
    else:
        lo = int(rng.integers(0, 10**7))
    return lo, lo + size
